#!/usr/bin/python3
"""Train a tiny model on two DYAD "nodes" that share a dataset through DYAD.

What happens:
  * A LocalCluster starts two dyad-service processes on loopback (node 0
    hosts the metadata store); a small dataset of .npy samples is written to
    a plain shared directory standing in for the parallel file system (PFS).
  * Node 0 trains first, with a DataLoader of --workers processes over a
    pydyad.data.DyadDataset: every sample misses DYAD, is read from the PFS,
    cached into node 0's managed directory and published (seed case 4).
  * Node 1 then trains on the same dataset: every sample is published, so
    it arrives from node 0 through DYAD, never touching the PFS.
Each node is a separate process whose environment (DYAD_SERVICE_SOCKET,
DYAD_PATH_PRODUCER, DYAD_PATH_CONSUMER) makes it part of that node.

Run from a build tree:
  PYTHONPATH=build/python DYAD_BUILD_DIR=build /usr/bin/python3 \\
      python/examples/train_two_nodes.py
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import time


def make_dataset(pfs, samples, features, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(features)
    os.makedirs(pfs, exist_ok=True)
    files = []
    for i in range(samples):
        x = rng.standard_normal(features).astype(np.float32)
        label = np.float32(1.0 if float(x @ w) > 0 else 0.0)
        name = f"sample{i:05d}.npy"
        np.save(os.path.join(pfs, name), np.append(x, label))
        files.append(name)
    return files


def train(args):
    """One node's training run (runs inside that node's environment)."""
    import numpy as np
    import torch
    from pydyad.data import DyadDataset

    files = sorted(f for f in os.listdir(args.pfs) if f.endswith(".npy"))

    def reader(path):
        a = np.load(path)
        return torch.from_numpy(a[:-1]), torch.tensor(int(a[-1]), dtype=torch.long)

    ds = DyadDataset(files, args.pfs, reader=reader, return_source=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                                         num_workers=args.workers, persistent_workers=False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(args.features, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sources = collections.Counter()
        total, t0 = 0.0, time.monotonic()
        for (x, y), src in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total += float(loss) * len(y)
            sources.update(src)
        print(json.dumps({"node": args.node, "epoch": epoch, "loss": total / len(ds),
                          "seconds": time.monotonic() - t0, "sources": dict(sources)}),
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.environ.get("DYAD_BUILD_DIR"),
                    help="directory holding dyad-service (default $DYAD_BUILD_DIR, then PATH)")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--role", choices=["main", "train"], default="main", help=argparse.SUPPRESS)
    ap.add_argument("--node", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--pfs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "train":
        train(args)
        return 0

    from pydyad.cluster import LocalCluster
    with LocalCluster(nodes=2, build_dir=args.build_dir, namespace="train-example") as cl:
        pfs = os.path.join(cl.workdir, "pfs")
        make_dataset(pfs, args.samples, args.features)
        print(f"dataset: {args.samples} samples in {pfs} (the 'PFS'); services in {cl.workdir}")
        for node in (0, 1):
            cmd = [sys.executable, os.path.abspath(__file__), "--role", "train", "--node",
                   str(node), "--pfs", pfs, "--samples", str(args.samples), "--features",
                   str(args.features), "--batch-size", str(args.batch_size), "--workers",
                   str(args.workers), "--epochs", str(args.epochs)]
            env = cl.node_env(node, DYAD_CONSUME_TIMEOUT=60)
            res = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=600)
            if res.returncode != 0:
                print(f"node {node} failed ({res.returncode}); service log:\n{cl.log(node)}")
                return 1
            for line in res.stdout.splitlines():
                r = json.loads(line)
                print(f"node {r['node']} epoch {r['epoch']}: loss {r['loss']:.4f}  "
                      f"{r['seconds']:.2f}s  samples from {r['sources']}")
        cached = len(os.listdir(cl.prod_dir(0)))
        fetched = len(os.listdir(cl.cons_dir(1)))
        print(f"node 0 cached {cached} samples from the PFS; node 1 received {fetched} via DYAD")
    return 0


if __name__ == "__main__":
    sys.exit(main())
