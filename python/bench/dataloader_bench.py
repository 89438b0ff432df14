#!/usr/bin/python3
"""DataLoader throughput: pydyad.data.DyadDataset vs reading one shared directory.

One run, same files, same DataLoader settings (--workers processes, batch
--batch-size), two loopback DYAD "nodes" (LocalCluster):

  shared dir      every sample read from the shared directory (the "PFS");
  dyad node 0     epoch 1 reads the PFS, caches and publishes (case 4),
                  epoch 2 reads the node's own copies;
  dyad node 1     epoch 1 receives every sample from node 0 through DYAD,
                  with the next --lookahead samples of the sampler's order
                  fetched while the current batch trains (0: none);
                  epoch 2 reads its consumer copies.

samples/s = samples / wall time of the epoch, DataLoader worker start-up
included (the same for every row). On one machine the "PFS" is a local
directory in the page cache, so the shared-dir row is a best case no real
parallel file system reaches; pass --pfs-dir to put the originals on a real
shared mount. Each row runs in a fresh process of the node it names.

The nodes' DYAD directories (what a compute node keeps on node-local tmpfs
or NVMe) go under --node-dir: by default /dev/shm when it has room, as for
every cluster benchmark of `make bench`, else the temporary directory. On
the development VM the temporary directory is an ext4 without a journal,
where creating a file costs up to 0.3 ms of CPU while other programs
delete many files there (the inode allocator skips recently deleted
inodes one by one); epoch 1 on node 1 creates one file per sample, so
there its rate depends on what others deleted in the last seconds (pass
--node-dir /tmp to see it).

  PYTHONPATH=build/python DYAD_BUILD_DIR=build /usr/bin/python3 \\
      python/bench/dataloader_bench.py --samples 512 --sample-kib 256
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def run_epochs(args):
    """Runs inside one node's environment; prints one JSON line per epoch."""
    import numpy as np
    import torch
    from pydyad.data import DyadDataset

    files = sorted(f for f in os.listdir(args.pfs) if f.endswith(".npy"))

    def reader(path):
        return torch.from_numpy(np.load(path))

    if args.mode == "plain":
        class Plain(torch.utils.data.Dataset):
            def __len__(self):
                return len(files)

            def __getitem__(self, i):
                return reader(os.path.join(args.pfs, files[i])), "pfs"
        ds = Plain()
    else:
        ds = DyadDataset(files, args.pfs, reader=reader, return_source=True,
                         lookahead=args.lookahead)
    if args.mode != "plain" and args.lookahead > 0:
        sampler = ds.lookahead_sampler(torch.utils.data.RandomSampler(ds))
        loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, sampler=sampler,
                                             num_workers=args.workers)
    else:
        loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                                             num_workers=args.workers)
    for epoch in range(args.epochs):
        t0 = time.monotonic()
        n, sources = 0, {}
        checksum = 0.0
        for x, src in loader:
            n += len(x)
            checksum += float(x[:, 0].sum())
            for s in src:
                sources[s] = sources.get(s, 0) + 1
        dt = time.monotonic() - t0
        print(json.dumps({"epoch": epoch, "samples": n, "seconds": dt, "sources": sources,
                          "checksum": checksum}), flush=True)


def default_node_dir(need):
    """/dev/shm when it is writable with `need` bytes and 1 GiB to spare,
    else None (the temporary directory)."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > need + (1 << 30) and os.access("/dev/shm", os.W_OK):
            return "/dev/shm"
    except OSError:
        pass
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.environ.get("DYAD_BUILD_DIR"))
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--sample-kib", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--lookahead", type=int, default=64,
                    help="samples DyadDataset fetches ahead of the sampler (0: off)")
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    ap.add_argument("--pfs-dir", help="parent directory for the originals (default: a temp dir)")
    ap.add_argument("--node-dir", help="parent directory for the nodes' DYAD directories "
                                       "(default: /dev/shm when it has room, else a temp dir)")
    ap.add_argument("--role", default="main", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="dyad", help=argparse.SUPPRESS)
    ap.add_argument("--pfs", help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, default=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "run":
        run_epochs(args)
        return 0

    import numpy as np
    from pydyad.cluster import LocalCluster

    pfs = tempfile.mkdtemp(prefix="pydyad-bench-pfs-", dir=args.pfs_dir)
    try:
        n_floats = args.sample_kib * 1024 // 4
        for i in range(args.samples):
            np.save(os.path.join(pfs, f"s{i:06d}.npy"), np.full(n_floats, i, dtype=np.float32))
        expected = float(sum(range(args.samples)))
        rows = []
        node_dir = args.node_dir or default_node_dir(3 * args.samples * args.sample_kib * 1024)
        with LocalCluster(nodes=2, build_dir=args.build_dir, namespace="dataloader-bench",
                          base_dir=node_dir) as cl:
            for label, node, mode in (("shared dir", 0, "plain"), ("dyad node 0", 0, "dyad"),
                                      ("dyad node 1", 1, "dyad")):
                cmd = [sys.executable, os.path.abspath(__file__), "--role", "run", "--mode", mode,
                       "--pfs", pfs, "--batch-size", str(args.batch_size),
                       "--workers", str(args.workers), "--lookahead", str(args.lookahead)]
                res = subprocess.run(cmd, env=cl.node_env(node, DYAD_CONSUME_TIMEOUT=120),
                                     stdout=subprocess.PIPE, text=True, timeout=1800)
                if res.returncode != 0:
                    print(f"{label} failed ({res.returncode}); service log:\n{cl.log(node)}")
                    return 1
                for line in res.stdout.splitlines():
                    r = json.loads(line)
                    if r["checksum"] != expected or r["samples"] != args.samples:
                        print(f"{label}: wrong data (checksum {r['checksum']} != {expected})")
                        return 1
                    rows.append((label, r["epoch"] + 1, r["samples"], r["seconds"], r["sources"]))
        mib = args.samples * args.sample_kib / 1024
        if args.json:
            print(json.dumps({"bench": "dataloader", "samples": args.samples,
                              "sample_kib": args.sample_kib, "lookahead": args.lookahead,
                              "node_dir": node_dir or tempfile.gettempdir(),
                              "rows": [{"reader": label, "epoch": epoch,
                                        "samples_per_s": n / secs, "sources": src}
                                       for label, epoch, n, secs, src in rows]}))
            return 0
        print(f"\n{args.samples} samples x {args.sample_kib} KiB ({mib:.0f} MiB), "
              f"batch {args.batch_size}, {args.workers} workers, "
              f"node directories in {node_dir or tempfile.gettempdir()}\n")
        print(f"{'reader':<12} {'epoch':>5} {'samples/s':>10} {'MiB/s':>8}  sources")
        for label, epoch, n, secs, src in rows:
            srcs = ", ".join(f"{k} {v}" for k, v in sorted(src.items()))
            print(f"{label:<12} {epoch:>5} {n / secs:>10.0f} {mib / secs:>8.0f}  {srcs}")
    finally:
        shutil.rmtree(pfs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
