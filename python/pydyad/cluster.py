"""LocalCluster: several dyad-service "nodes" on one machine, for tests,
examples and benchmarks.

Each node is one dyad-service on loopback with its own Unix socket and its
own producer and consumer directories; rank 0 hosts the embedded metadata
store and the others point at it. A Python process becomes "node r" through
the environment from :meth:`LocalCluster.node_env` (DYAD_SERVICE_SOCKET,
DYAD_PATH_PRODUCER, DYAD_PATH_CONSUMER, DYAD_KVS_NAMESPACE).

Every wait is bounded; :meth:`stop` (also run by ``with`` and by the
fixture on failure) terminates the services it started - SIGTERM, then
SIGKILL after a grace period - and removes the directory it created. The
services also get SIGTERM if the starting process dies without stopping
them (Linux parent-death signal).
"""

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time


def _die_with_parent():
    # Runs in the child between fork and exec: ask the kernel to send
    # SIGTERM when the parent dies, so a killed test run (ctest timeout,
    # SIGKILL) leaves no service behind. Linux only; best effort elsewhere.
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def find_service(build_dir=None):
    """Path of dyad-service: ``build_dir``, $DYAD_BUILD_DIR, then PATH."""
    for d in (build_dir, os.environ.get("DYAD_BUILD_DIR")):
        if d:
            cand = os.path.join(d, "dyad-service")
            if os.access(cand, os.X_OK):
                return cand
    found = shutil.which("dyad-service")
    if found:
        return found
    raise FileNotFoundError("dyad-service not found: pass build_dir, set DYAD_BUILD_DIR, "
                            "or put it on PATH")


class LocalCluster:
    def __init__(self, nodes=2, build_dir=None, base_dir=None, namespace=None,
                 start_timeout=20.0, keep=False):
        self.service = find_service(build_dir)
        self.nodes = nodes
        self.namespace = namespace
        self.start_timeout = start_timeout
        self.keep = keep
        self.workdir = tempfile.mkdtemp(prefix="pydyad-cluster-", dir=base_dir)
        self.procs = []
        self.ready = []

    # -- paths ------------------------------------------------------------
    def prod_dir(self, rank):
        return os.path.join(self.workdir, f"node{rank}", "prod")

    def cons_dir(self, rank):
        return os.path.join(self.workdir, f"node{rank}", "cons")

    def socket(self, rank):
        return os.path.join(self.workdir, f"node{rank}", "service.sock")

    def node_env(self, rank, base=None, **extra):
        """Environment that makes a process part of node ``rank``."""
        env = dict(os.environ if base is None else base)
        env.update(DYAD_SERVICE_SOCKET=self.socket(rank),
                   DYAD_PATH_PRODUCER=self.prod_dir(rank),
                   DYAD_PATH_CONSUMER=self.cons_dir(rank))
        if self.namespace:
            env["DYAD_KVS_NAMESPACE"] = self.namespace
        else:
            env.pop("DYAD_KVS_NAMESPACE", None)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    # -- lifecycle ----------------------------------------------------------
    def start(self):
        try:
            secret = os.path.join(self.workdir, "secret")
            fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            root = None
            for rank in range(self.nodes):
                # Holds the service's socket: dyad-service refuses a
                # directory group or others can access.
                node = os.path.join(self.workdir, f"node{rank}")
                os.makedirs(node, mode=0o700)
                os.chmod(node, 0o700)
                os.makedirs(self.prod_dir(rank))
                os.makedirs(self.cons_dir(rank))
                ready = os.path.join(self.workdir, f"node{rank}", "ready")
                kvs = "embedded" if rank == 0 else f"embedded://{root}"
                cmd = [self.service, "-r", str(rank), "-k", kvs, "-l", "127.0.0.1:0",
                       "-s", self.socket(rank), "--secret-file", secret,
                       "--ready-file", ready, "--cons-path", self.cons_dir(rank),
                       self.prod_dir(rank)]
                log = open(os.path.join(self.workdir, f"node{rank}", "service.log"), "wb")
                env = {k: v for k, v in os.environ.items() if not k.startswith("DYAD_")}
                try:
                    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_die_with_parent)
                finally:
                    log.close()
                self.procs.append(proc)
                info = self._wait_ready(proc, ready, rank)
                self.ready.append(info)
                if rank == 0:
                    root = info["advertise"]
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, proc, ready, rank):
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"dyad-service rank {rank} exited with {proc.returncode}: "
                                   f"{self.log(rank)}")
            try:
                with open(ready) as f:
                    info = dict(line.strip().split("=", 1) for line in f if "=" in line)
                if "listen" in info and "socket" in info and os.path.exists(info["socket"]):
                    return info
            except FileNotFoundError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"dyad-service rank {rank} not ready after {self.start_timeout}s: "
                           f"{self.log(rank)}")

    def log(self, rank):
        try:
            with open(os.path.join(self.workdir, f"node{rank}", "service.log"), "rb") as f:
                return f.read().decode(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, grace=10.0):
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.procs = []
        if not self.keep and os.path.isdir(self.workdir):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
