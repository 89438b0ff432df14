"""Failures surface as DyadError with the right dyad_rc_t name and message."""

import os

import pytest

from pydyad import Dyad, DyadError


def test_dyad_error_is_a_runtime_error():
    assert issubclass(DyadError, RuntimeError)


def test_consume_timeout(cluster, node1, monkeypatch, unique):
    monkeypatch.setenv("DYAD_CONSUME_TIMEOUT", "1")
    node1.init(reinit=True, prod_managed_path=cluster.prod_dir(1),
               cons_managed_path=cluster.cons_dir(1), kvs_namespace=cluster.namespace)
    with pytest.raises(DyadError) as ei:
        node1.consume(os.path.join(cluster.cons_dir(1), unique))
    e = ei.value
    assert e.name == "DYAD_RC_TIMEOUT"
    assert e.rc == -4000
    assert str(e).startswith("DYAD_RC_TIMEOUT: ")
    assert unique in str(e)
    # get_metadata with should_wait is bounded the same way.
    with pytest.raises(DyadError) as ei:
        node1.get_metadata(os.path.join(cluster.cons_dir(1), unique), should_wait=True)
    assert ei.value.name == "DYAD_RC_TIMEOUT"


def test_flux_handle_that_is_no_handle_is_refused():
    # flux_handle takes an open flux.Flux (tests/flux covers a real one);
    # anything else, plain addresses included, is refused before it could
    # reach the C library as a pointer.
    d = Dyad()
    for bogus in (object(), 1, "local:///tmp/x"):
        with pytest.raises(TypeError):
            d.init(prod_managed_path="/tmp", flux_handle=bogus)
        with pytest.raises(TypeError):
            d.init_env(flux_handle=bogus)
    assert not d.initialized


def test_bad_settings(tmp_path):
    d = Dyad()
    try:
        with pytest.raises(DyadError) as ei:
            d.init(reinit=True, prod_managed_path=str(tmp_path), dtl_mode="CARRIER_PIGEON")
        assert ei.value.name == "DYAD_RC_BADDTLMODE"
        with pytest.raises(DyadError) as ei:
            d.init(reinit=True, cons_managed_path="")
        assert ei.value.name == "DYAD_RC_BADMANAGEDPATH"
        with pytest.raises(TypeError):
            d.init(reinit=True, prod_managed_path=str(tmp_path), dtl_mode=3.5)
    finally:
        d.finalize()


def test_no_service(tmp_path, monkeypatch):
    monkeypatch.setenv("DYAD_SERVICE_SOCKET", str(tmp_path / "nobody.sock"))
    (tmp_path / "p").mkdir()
    f = tmp_path / "p" / "a.dat"
    f.write_bytes(b"a")
    d = Dyad()
    d.init(reinit=True, prod_managed_path=str(tmp_path / "p"))
    try:
        with pytest.raises(DyadError) as ei:
            d.produce(str(f))
        assert ei.value.name == "DYAD_RC_NOSERVICE"
        assert "nobody.sock" in str(ei.value)
    finally:
        d.finalize()


def test_produce_missing_file(cluster, node1):
    with pytest.raises(DyadError) as ei:
        node1.produce(os.path.join(cluster.prod_dir(1), "does-not-exist.dat"))
    assert ei.value.name == "DYAD_RC_BADFIO"


def test_escape_with_relative_paths(cluster, node1):
    node1.init(reinit=True, relative_to_managed_path=True, kvs_namespace=cluster.namespace,
               prod_managed_path=cluster.prod_dir(1), cons_managed_path=cluster.cons_dir(1))
    with pytest.raises(DyadError) as ei:
        node1.consume("../../etc/passwd")
    assert ei.value.name == "DYAD_RC_PERM"


def test_uninitialized_context(nodes):
    out = nodes.run(1, """
        import pydyad
        try:
            pydyad.Dyad().consume("/x")
        except pydyad.DyadError as e:
            print(e.name, e.rc)
    """).stdout
    assert out.split() == ["DYAD_RC_NOCTX", "-1000"]


def test_error_rebuilt_from_message_keeps_fields():
    # DataLoader re-raises a worker's exception as type(msg): the fields
    # must still exist (as None) rather than raise AttributeError.
    e = DyadError("from a worker")
    assert e.rc is None and e.name is None
