"""The scale section of `make bench` (issue 16): dyad-scale at 2, 8, 32 and 64
emulated nodes, all-to-all small files and a one-to-all fan-out, each beside
raw TCP between the same namespaces in the same run (docs/scale.md).

run_bench.py calls run() to measure, plot() for the figure and
report_lines() for the report; each takes what run() returned.
"""

import os

# Default profile: a few minutes on 2 shared cores. The fan-out file is
# 64 MiB rather than dyad-scale's own default of 256 MiB: 63 copies of it
# are written twice (DYAD, then raw TCP) and verified, and 32 GiB of
# copies would take minutes and most of the machine's memory when node
# directories are on /dev/shm. --quick: under a minute, still 2 to 64 nodes
# so that the 64-versus-8 target is checked in every run.
PROFILES = {
    "default": {"nodes": [2, 8, 32, 64], "files": 50, "peers": 4, "size": 4096,
                "fanout_mib": 64},
    "quick": {"nodes": [2, 8, 64], "files": 10, "peers": 4, "size": 4096, "fanout_mib": 8},
}

# The target: all-to-all files/s at 64 nodes >= 0.5 x that at 8.
TARGET_64_VS_8 = 0.5


def run(r, quick):
    """Runs dyad-scale once per node count through run_bench's Runner `r`
    (timeouts, retry, log). Returns {"profile": ..., "rows": [...],
    "ratio_64_vs_8": x or None}."""
    prof = PROFILES["quick" if quick else "default"]
    prog = r.prog("dyad-scale")
    res = {"profile": prof, "rows": [], "ratio_64_vs_8": None}
    if not os.access(prog, os.X_OK):
        r.failures.append("scale: %s not built" % prog)
        return res
    for n in prof["nodes"]:
        argv = [prog, "--nodes", str(n), "--files", str(prof["files"]), "--peers",
                str(prof["peers"]), "--size", str(prof["size"]), "--fanout-mib",
                str(prof["fanout_mib"]), "--json"] + r.cluster_args()
        j = r.json_of(argv, 90 + 3 * n, label="scale: %d nodes" % n)
        row = {"nodes": n, "ok": j is not None}
        if j and j.get("results"):
            row.update(j["results"][0])
        res["rows"].append(row)
    by_nodes = {row["nodes"]: row for row in res["rows"] if row["ok"]}
    if 8 in by_nodes and 64 in by_nodes and by_nodes[8].get("a2a_files_per_s"):
        res["ratio_64_vs_8"] = by_nodes[64]["a2a_files_per_s"] / by_nodes[8]["a2a_files_per_s"]
    return res


def plot(out, scale):
    """scale.png: all-to-all files/s and fan-out MB/s against nodes, DYAD and
    raw TCP. Returns {"scale": file name} (empty when there is nothing)."""
    rows = [row for row in (scale or {}).get("rows", []) if row.get("ok")]
    if not rows:
        return {}
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = [row["nodes"] for row in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot(nodes, [row["a2a_files_per_s"] for row in rows], "o-", label="DYAD")
    ax1.plot(nodes, [row["raw_files_per_s"] for row in rows], "s--", label="raw TCP")
    ax1.set_title("all-to-all, %d files of %d B per node, %d peers" % (
        scale["profile"]["files"], scale["profile"]["size"], scale["profile"]["peers"]))
    ax1.set_ylabel("aggregate files/s")
    ax2.plot(nodes, [row["fan_mb_per_s"] for row in rows], "o-", label="DYAD")
    ax2.plot(nodes, [row["fan_raw_mb_per_s"] for row in rows], "s--", label="raw TCP")
    ax2.set_title("fan-out of one %d MiB file to every other node" %
                  scale["profile"]["fanout_mib"])
    ax2.set_ylabel("aggregate MB/s")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(nodes)
        ax.set_xticklabels([str(n) for n in nodes])
        ax.set_xlabel("emulated nodes (2 shared cores)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scale.png"), dpi=110)
    plt.close(fig)
    return {"scale": "scale.png"}


def _f(v, digits=0):
    return "n/a" if v is None else ("%.*f" % (digits, v))


def report_lines(scale, figs):
    """The report's "Scale" section (markdown lines)."""
    if not scale:
        return []
    prof = scale["profile"]
    L = ["\n## Scale (emulated nodes)\n",
         "dyad-scale, one cluster per node count (a namespace per node on one bridge, a "
         "dyad-service each, the embedded root on node 0). All-to-all: every node publishes "
         "%d files of %d B and consumes those of its %d next nodes, consumers started first; "
         "latency from the producer closing a file to the consume returning. Fan-out: one "
         "%d MiB file from node 1 to every other node at once. Raw TCP: the same patterns "
         "through a plain file server in the same namespaces. Every byte verified. All nodes "
         "share this machine's cores: see docs/scale.md for what carries over.\n" % (
             prof["files"], prof["size"], prof["peers"], prof["fanout_mib"])]
    header = ["nodes", "start s", "services RSS MiB", "files/s", "p50/p99 ms", "root ops/s",
              "raw files/s", "DYAD/raw", "fan-out MB/s", "raw MB/s", "DYAD/raw",
              "producer sent", "failures"]
    L.append("| " + " | ".join(header) + " |")
    L.append("|" + "---|" * len(header))
    for row in scale["rows"]:
        if not row.get("ok"):
            L.append("| %d | failed (run.log) |" % row["nodes"] + " |" * (len(header) - 2))
            continue
        L.append("| " + " | ".join([
            str(row["nodes"]), _f(row["start_s"], 1), _f(row["services_rss_mib"]),
            _f(row["a2a_files_per_s"]),
            "%s / %s" % (_f(row["a2a_p50_ms"], 2), _f(row["a2a_p99_ms"], 2)),
            _f(row["root_ops_per_s"]), _f(row["raw_files_per_s"]), _f(row["a2a_ratio"], 2),
            _f(row["fan_mb_per_s"]), _f(row["fan_raw_mb_per_s"]), _f(row["fan_ratio"], 2),
            "%.0f MiB" % (row["fan_producer_bytes_out"] / 1048576.0),
            str(row["failures"])]) + " |")
    ratio = scale.get("ratio_64_vs_8")
    if ratio is not None:
        L.append("\nAll-to-all files/s at 64 nodes / at 8 nodes: **%.2f** (target >= %.1f: %s).\n"
                 % (ratio, TARGET_64_VS_8, "met" if ratio >= TARGET_64_VS_8 else "NOT met"))
    if "scale" in figs:
        L.append("\n![scale](%s)\n" % figs["scale"])
    return L
