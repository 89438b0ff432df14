"""produce/consume across two services, metadata pre-fetch, Ctrl-C, fork."""

import os
import signal
import time
import uuid

import pytest

from pydyad import Dyad, DyadMetadata, RawMetadata


def _produce_snippet(nodes, name, payload):
    # Large payloads travel through a file (a command line is limited),
    # inside the cluster's directory, which the fixture always removes.
    src = os.path.join(nodes.cluster.workdir, f"src-{uuid.uuid4().hex}")
    with open(src, "wb") as f:
        f.write(payload)
    return f"""
        import os, pydyad
        d = pydyad.Dyad(); d.init_env()
        p = os.path.join(os.environ["DYAD_PATH_PRODUCER"], {name!r})
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open({src!r}, "rb") as f:
            data = f.read()
        os.unlink({src!r})
        with open(p, "wb") as f:
            f.write(data)
        d.produce(p)
        d.finalize()
    """


def test_produce_then_consume_across_services(cluster, nodes, node1, unique):
    name = f"{unique}/frame0.bin"
    payload = os.urandom(300_000)
    nodes.run(0, _produce_snippet(nodes, name, payload))
    cons = os.path.join(cluster.cons_dir(1), name)
    node1.consume(cons)
    with open(cons, "rb") as f:
        assert f.read() == payload
    # The copy is node 1's consumer copy, not something node 1 produced.
    assert not os.path.exists(os.path.join(cluster.prod_dir(1), name))
    # A second consume finds the complete local copy.
    node1.consume(cons)


def test_consume_waits_for_publication(cluster, nodes, unique):
    name = f"{unique}.dat"
    consumer = nodes.popen(1, f"""
        import os, pydyad
        d = pydyad.Dyad(); d.init_env()
        p = os.path.join(os.environ["DYAD_PATH_CONSUMER"], {name!r})
        d.consume(p)
        print(open(p, "rb").read().decode())
    """, DYAD_CONSUME_TIMEOUT=30)
    try:
        time.sleep(0.5)
        assert consumer.poll() is None, "consume returned before the file was published"
        nodes.run(0, _produce_snippet(nodes, name, b"late data"))
        out, err = consumer.communicate(timeout=30)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()
    assert consumer.returncode == 0, err
    assert out.strip() == "late data"


def test_empty_file_is_data(cluster, nodes, node1, unique):
    name = f"{unique}.empty"
    nodes.run(0, _produce_snippet(nodes, name, b""))
    cons = os.path.join(cluster.cons_dir(1), name)
    node1.consume(cons)
    assert os.path.getsize(cons) == 0


def test_metadata_prefetch(cluster, nodes, node1, unique):
    name = f"{unique}/m.bin"
    payload = b"x" * 1234
    cons = os.path.join(cluster.cons_dir(1), name)
    # Not published yet and not waiting: None, not an exception.
    assert node1.get_metadata(cons, should_wait=False) is None
    nodes.run(0, _produce_snippet(nodes, name, payload))

    md = node1.get_metadata(cons)
    assert isinstance(md, DyadMetadata)
    assert md.fpath == name
    assert md.owner_rank == 0
    assert md.size == len(payload)
    assert md.version > 0

    raw = node1.get_metadata(cons, raw=True)
    assert isinstance(raw, RawMetadata)
    assert (raw.fpath, raw.owner_rank, raw.size) == (name, 0, len(payload))
    assert not os.path.exists(cons)
    node1.consume_w_metadata(cons, raw)
    node1.free_metadata(raw)
    node1.free_metadata(raw)  # idempotent
    assert not raw.valid
    with open(cons, "rb") as f:
        assert f.read() == payload
    with pytest.raises(ValueError):
        node1.consume_w_metadata(cons, raw)
    # The plain-Python record is accepted too, and None means "local".
    node1.consume_w_metadata(cons, md)
    node1.consume_w_metadata(cons, None)
    # should_wait on a published file returns its record at once.
    assert node1.get_metadata(cons, should_wait=True) == md


def test_paths_outside_managed_dirs_are_ignored(node1, tmp_path):
    p = tmp_path / "plain.txt"
    p.write_text("hi")
    node1.produce(str(p))
    node1.consume(p)  # os.PathLike accepted
    assert node1.get_metadata(str(p)) is None


def test_several_dyad_objects_share_the_context(node1):
    other = Dyad()
    assert other.initialized
    assert "initialized=True" in repr(other)


def test_ctrl_c_interrupts_a_waiting_consume(cluster, nodes, unique):
    proc = nodes.popen(1, f"""
        import os, sys, pydyad
        d = pydyad.Dyad(); d.init_env()
        print("waiting", flush=True)
        try:
            d.consume(os.path.join(os.environ["DYAD_PATH_CONSUMER"], {unique!r}))
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
    """)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=10)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 3, err
    assert "interrupted" in out
    assert elapsed < 3.0


def test_other_threads_run_while_consume_waits(cluster, nodes, unique):
    # The GIL is released during the wait: a Python thread keeps counting.
    out = nodes.run(1, f"""
        import os, threading, time, pydyad
        d = pydyad.Dyad(); d.init_env()
        ticks = [0]
        stop = threading.Event()
        def spin():
            while not stop.is_set():
                ticks[0] += 1
                time.sleep(0.01)
        t = threading.Thread(target=spin); t.start()
        try:
            d.consume(os.path.join(os.environ["DYAD_PATH_CONSUMER"], {unique!r}))
        except pydyad.DyadError as e:
            print(e.name)
        stop.set(); t.join()
        print(ticks[0])
    """, DYAD_CONSUME_TIMEOUT=1).stdout.split()
    assert out[0] == "DYAD_RC_TIMEOUT"
    assert int(out[1]) > 20


def test_forked_child_uses_the_context(cluster, nodes, unique):
    name = f"{unique}.fork"
    nodes.run(0, _produce_snippet(nodes, name, b"forked"))
    out = nodes.run(1, f"""
        import os, pydyad
        d = pydyad.Dyad(); d.init_env()
        p = os.path.join(os.environ["DYAD_PATH_CONSUMER"], {name!r})
        assert d.get_metadata(p) is not None   # parent uses the connection first
        pid = os.fork()
        if pid == 0:
            try:
                d.consume(p)
                os._exit(0 if open(p, "rb").read() == b"forked" else 1)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """).stdout
    assert out.strip() == "0"


def test_threads_consume_concurrently(cluster, nodes, node1, unique):
    import threading
    names = [f"{unique}/th{i}" for i in range(4)]
    for n in names:
        nodes.run(0, _produce_snippet(nodes, n, n.encode() * 1000))
    errors = []

    def consume(name):
        try:
            node1.consume(os.path.join(cluster.cons_dir(1), name))
        except Exception as e:  # collected and asserted below
            errors.append(e)
    # Every file twice: concurrent consumers of one file on one node.
    threads = [threading.Thread(target=consume, args=(n,)) for n in names + names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    for n in names:
        with open(os.path.join(cluster.cons_dir(1), n), "rb") as f:
            assert f.read() == n.encode() * 1000


def test_non_utf8_and_bytes_names(cluster, node1):
    name = b"caf\xe9-latin1.bin"  # not valid UTF-8
    prod = os.path.join(os.fsencode(cluster.prod_dir(1)), name)
    with open(prod, "wb") as f:
        f.write(b"bytes name")
    node1.produce(prod)
    md = node1.get_metadata(os.path.join(os.fsencode(cluster.cons_dir(1)), name))
    assert md is not None and md.size == len(b"bytes name")
    assert md.fpath == os.fsdecode(name)
    raw = node1.get_metadata(os.path.join(os.fsencode(cluster.cons_dir(1)), name), raw=True)
    assert "caf" in repr(raw)
    raw.free()
