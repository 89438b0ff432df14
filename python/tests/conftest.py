"""Fixtures for the pydyad tests: a two-node loopback DYAD cluster.

The ``cluster`` fixture starts two real dyad-service processes (rank 0 hosts
the embedded metadata store) from $DYAD_BUILD_DIR and always stops them and
removes their directory, even when a test fails. ``run_node`` runs a Python
snippet as a process of one node (the C context is per process, so "another
node" has to be another process) with a hard timeout.
"""

import os
import subprocess
import sys
import textwrap
import uuid

import pytest

from pydyad.cluster import LocalCluster, find_service


def _build_dir():
    return os.environ.get("DYAD_BUILD_DIR")


@pytest.fixture(scope="session")
def cluster():
    try:
        find_service(_build_dir())
    except FileNotFoundError as e:
        pytest.skip(str(e))
    c = LocalCluster(nodes=2, build_dir=_build_dir(), namespace="pydyad-tests")
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def unique():
    """A fresh relative name per test, so tests never see each other's files."""
    return "t-" + uuid.uuid4().hex[:12]


class NodeRunner:
    def __init__(self, cluster):
        self.cluster = cluster

    def env(self, rank, **extra):
        return self.cluster.node_env(rank, **extra)

    def popen(self, rank, code, **extra):
        return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                                env=self.env(rank, **extra), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def run(self, rank, code, timeout=60, check=True, **extra):
        proc = self.popen(rank, code, **extra)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate(timeout=10)
            pytest.fail(f"node {rank} snippet timed out after {timeout}s\n{out}\n{err}")
        if check and proc.returncode != 0:
            pytest.fail(f"node {rank} snippet failed ({proc.returncode}):\n{out}\n{err}")
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def nodes(cluster):
    return NodeRunner(cluster)


@pytest.fixture
def node1(cluster, monkeypatch):
    """Makes this test process node 1 (explicit init), finalized afterwards."""
    import pydyad
    for k, v in cluster.node_env(1, base={}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("DYAD_CONSUME_TIMEOUT", raising=False)
    d = pydyad.Dyad()
    d.init(reinit=True, kvs_namespace=cluster.namespace,
           prod_managed_path=cluster.prod_dir(1), cons_managed_path=cluster.cons_dir(1))
    try:
        yield d
    finally:
        d.finalize()
