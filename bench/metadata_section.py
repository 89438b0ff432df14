"""The metadata-at-scale section of `make bench` (issue 16), used by run_bench.py.

Three programs, each printing JSON:
  * dyad-metadata-scale: publish + locate from N clients (one Kvs each, as N
    services) against the embedded root, one redis-server and a three-master
    Redis Cluster, side by side in one run: ops/s, p50/p99, and operations per
    store CPU-second (the store's own cost, the figure that carries over to a
    cluster whose clients run on other nodes);
  * dyad-waits (async mode, the way a dyad-service parks consumes): waits on
    distinct keys and on one key, all parked before publication; p50/p99
    wake-up latency and the threads/RSS they cost;
  * dyad-idle-connections: one service under idle local clients and idle
    authenticated peers: threads, RSS and the latency of real consumes.
"""

import os

PROFILES = {
    "default": {"clients": 64, "seconds": 3, "stores": "embedded,redis,redis-cluster",
                "distinct": 10000, "shared": 1000, "wait_stores": "memory,embedded,redis",
                "idle_clients": 10000, "idle_peers": 1000, "consumes": 100},
    "quick": {"clients": 64, "seconds": 1, "stores": "embedded,redis",
              "distinct": 2000, "shared": 200, "wait_stores": "embedded,redis",
              "idle_clients": 2000, "idle_peers": 200, "consumes": 30},
}


def run(r, quick):
    """Runs the section with Runner `r`; returns its results (a dict)."""
    p = PROFILES["quick" if quick else "default"]
    out = {"profile": p}
    j = r.json_of([r.prog("dyad-metadata-scale"), "--clients", str(p["clients"]),
                   "--seconds", str(p["seconds"]), "--stores", p["stores"], "--json"], 180,
                  label="metadata-scale %d clients (%s)" % (p["clients"], p["stores"]))
    out["ops"] = j.get("results", []) if j else []
    j = r.json_of([r.prog("dyad-waits"), "--distinct", str(p["distinct"]), "--shared",
                   str(p["shared"]), "--modes", "async", "--stores", p["wait_stores"], "--json"],
                  240, label="waits %d distinct, %d on one key (%s)" % (
                      p["distinct"], p["shared"], p["wait_stores"]))
    out["waits"] = j.get("results", []) if j else []
    argv = [r.prog("dyad-idle-connections"), "--clients", str(p["idle_clients"]), "--peers",
            str(p["idle_peers"]), "--consumes", str(p["consumes"]), "--json",
            "--service", r.prog("dyad-service")]
    if r.tmp:
        argv += ["--tmp", r.tmp]
    j = r.json_of(argv, 240, label="idle connections %d clients + %d peers" % (
        p["idle_clients"], p["idle_peers"]))
    out["idle"] = j.get("results", []) if j else []
    return out


def _fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return "{:,.{}f}".format(v, digits)
    return "{:,}".format(v)


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in row) + " |"
              for row in rows]
    return lines


def headline(res):
    """Headline lines for the report's summary."""
    md = res.get("metadata_scale") or {}
    lines = []
    ops = {o["store"]: o for o in md.get("ops", [])}
    emb = ops.get("embedded")
    if emb:
        lines.append("Embedded root: %s metadata ops/s from %d clients (%s ops per root "
                     "CPU-second; target 50,000 ops/s)" % (
                         _fmt(emb["ops_per_s"], 0), emb["clients"],
                         _fmt(emb["ops_per_store_cpu_s"], 0)))
    others = ["%s %s ops/s" % (s, _fmt(o["ops_per_s"], 0)) for s, o in ops.items()
              if s != "embedded"]
    if others:
        lines.append("Same run: " + ", ".join(others))
    for w in md.get("waits", []):
        if w["store"] in ("embedded", "redis") and w["mode"] == "async":
            lines.append("%s: %d waits (%s) woken, p99 %s ms, %d errors" % (
                w["store"], w["waits"], w["scenario"], _fmt(w["p99_ms"], 2), w["errors"]))
    return lines


def report(res):
    """The section's markdown lines."""
    md = res.get("metadata_scale")
    if not md:
        return []
    lines = ["## Metadata at scale (issue 16)", ""]
    ops = md.get("ops", [])
    if ops:
        lines += ["Publish + locate from many clients, one Kvs each (`dyad-metadata-scale`), all "
                  "stores in one run. On this machine clients and store share the cores, so "
                  "ops/s is bounded by both; ops per store CPU-second is the store's own cost.",
                  ""]
        lines += _table(["store", "clients", "ops/s", "put p50 us", "put p99 us", "get p50 us",
                         "get p99 us", "store CPU s", "ops per store CPU-s", "errors"],
                        [[o["store"], o["clients"], o["ops_per_s"], o["put_p50_us"],
                          o["put_p99_us"], o["get_p50_us"], o["get_p99_us"], o["store_cpu_s"],
                          o["ops_per_store_cpu_s"], o["errors"]] for o in ops])
        lines.append("")
    waits = md.get("waits", [])
    if waits:
        lines += ["Parked waits woken by publication (`dyad-waits --modes async`, as a "
                  "dyad-service parks consumes): wake-up latency from the Put of a key to the "
                  "wait's completion.", ""]
        lines += _table(["store", "scenario", "waits", "p50 ms", "p99 ms", "max ms",
                         "all woken ms", "errors", "threads", "RSS MiB", "store threads",
                         "store RSS MiB"],
                        [[w["store"], w["scenario"], w["waits"], w["p50_ms"], w["p99_ms"],
                          w["max_ms"], w["all_woken_ms"], w["errors"], w["threads"],
                          w["rss_mib"], w["store_threads"], w["store_rss_mib"]]
                         for w in waits])
        lines.append("")
    idle = md.get("idle", [])
    if idle:
        lines += ["One service under idle connections (`dyad-idle-connections`): its threads, "
                  "resident memory, and real consumes through it meanwhile.", ""]
        lines += _table(["idle connections", "threads", "RSS MiB", "consume p50 ms",
                         "consume p99 ms", "errors", "refused"],
                        [[s["label"], s["threads"], s["rss_mib"], s["consume_p50_ms"],
                          s["consume_p99_ms"], s["errors"], s["refused"]] for s in idle])
        lines.append("")
    return lines


def programs():
    """Programs the section needs in the build directory."""
    return ["dyad-metadata-scale", "dyad-waits", "dyad-idle-connections"]


def available(build):
    return all(os.access(os.path.join(build, n), os.X_OK) for n in programs())
