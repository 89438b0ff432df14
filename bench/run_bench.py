#!/usr/bin/python3
"""make bench: the whole DYAD benchmark suite on this machine, in bounded time.

Runs the benchmark programs of the build directory (dyad-transfer,
dyad-small-files, dyad-poll-baseline, dyad-metadata, dyad-preload-overhead, and
dyad-scale through scale_section.py),
each figure side by side with its baseline in the same invocation, and writes

  bench/results/<date>[-quick]/report.md     headline ratios, then per-section tables
  bench/results/<date>[-quick]/results.json  every number and the raw program output
  bench/results/<date>[-quick]/*.png         throughput, latency CDF and scaling plots

  /usr/bin/python3 bench/run_bench.py --build build            # default, < 10 min on 2 cores
  /usr/bin/python3 bench/run_bench.py --build build --quick    # < 2 min

Every program runs under a timeout; the programs tear their emulated clusters
down themselves, also when killed by SIGTERM. A failed measurement is recorded
as such and the run goes on. See docs/performance.md for what each figure means.
"""

import argparse
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time

import metadata_section  # noqa: E402  (bench/metadata_section.py)
import scale_section

MiB = 1 << 20
GiB = 1 << 30

# Sizes, counts and repetitions of the two run lengths. Chosen so that the
# default run stays under 10 minutes and --quick under 2 on 2 shared cores.
PROFILES = {
    "quick": {
        "transfer_sizes": [1 * MiB, 16 * MiB, 256 * MiB],
        "small_sizes": [1024, 4096, 65536, MiB],
        "small_count": 2000,
        "small_bytes_cap": 64 * MiB,
        "small_mode_sizes": [4096, MiB],
        "metadata_n": 300,
        "preload": ["--iterations", "5000", "--runs", "3"],
        "consumers": [1, 2, 4, 8],
        "consumer_file": 256 * 1024,
        "consumer_count": 240,
        "ring_nodes": [2, 4],
        "ring_size": 128 * MiB,
        "ring_reps": 1,
        "prefetch_count": 2000,
        "dataloader": ["--samples", "256", "--sample-kib", "64", "--lookahead", "64"],
    },
    "default": {
        "transfer_sizes": [1 * MiB, 16 * MiB, 256 * MiB, 1 * GiB, 4 * GiB],
        "small_sizes": [1024, 4096, 65536, MiB],
        "small_count": 5000,
        "small_bytes_cap": 512 * MiB,
        "small_mode_sizes": [4096, MiB],
        "metadata_n": 1000,
        "preload": ["--iterations", "20000", "--runs", "5"],
        "consumers": [1, 2, 4, 8],
        "consumer_file": 256 * 1024,
        "consumer_count": 800,
        "ring_nodes": [2, 4],
        "ring_size": 512 * MiB,
        "ring_reps": 3,
        "prefetch_count": 5000,
        "dataloader": ["--samples", "512", "--sample-kib", "64", "--lookahead", "64"],
    },
}


def transfer_reps(size, quick):
    # At least two repetitions where time allows: the order of the raw and
    # DYAD runs alternates between repetitions, and with one the run that
    # comes second reuses memory the first one freed.
    if size <= 64 * MiB:
        return 3
    return 1 if quick else 2


def human(n):
    for unit, f in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= f:
            v = n / f
            return ("%d %s" % (v, unit)) if v == int(v) else ("%.1f %s" % (v, unit))
    return "%d B" % n


def fmt(v, digits=1):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return ("%." + str(digits) + "f") % v
    return str(v)


def ratio(a, b):
    if a is None or b is None or not b:
        return None
    return a / b


class Runner:
    """Runs the benchmark programs, each under a timeout, and logs everything."""

    def __init__(self, build, out, env):
        self.build = build
        self.out = out
        self.env = env
        self.log = open(os.path.join(out, "run.log"), "w")
        self.failures = []
        self.tmp = None
        self.big_tmp = None
        self.last_error = None  # why the last json_of returned None

    def run(self, argv, timeout, env_extra=None, label=None, record=True):
        """(returncode, stdout) of one program; returncode None on timeout."""
        label = label or " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv))
        env = dict(self.env)
        env.update(env_extra or {})
        t0 = time.monotonic()
        self.log.write("$ %s\n" % " ".join(argv))
        self.log.flush()
        # A process group of its own, so a timeout ends the program and
        # whatever it started (the programs tear down their clusters on SIGTERM).
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                             text=True, start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                out, err = p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate()
            rc = None
        dt = time.monotonic() - t0
        self.log.write(out or "")
        self.log.write(err or "")
        self.log.write("# rc=%s, %.1f s\n\n" % (rc, dt))
        self.log.flush()
        status = "ok" if rc == 0 else ("TIMEOUT" if rc is None else "rc=%d" % rc)
        print("  %-70s %6.1f s  %s" % (label[:70], dt, status), flush=True)
        if rc != 0 and record:
            self.failures.append("%s: %s" % (label, status))
        return rc, out or ""

    def json_of(self, argv, timeout, env_extra=None, label=None, record=True):
        """The JSON object a program printed (None on failure, the reason in
        self.last_error; listed as a failed measurement unless `record` is
        false). A program that fails (not one that times out) gets one more
        attempt: on a shared machine a worker occasionally misses a deadline."""
        self.last_error = None
        for attempt in (1, 2):
            rc, out = self.run(argv, timeout, env_extra,
                               label if attempt == 1 else "(retry) " + (label or argv[0]),
                               record=False)
            if rc == 0 or rc is None:
                break
        if rc != 0:
            self.last_error = "TIMEOUT" if rc is None else "rc=%d" % rc
            if record:
                self.failures.append("%s: %s" % (label or argv[0], self.last_error))
            return None
        start = out.find("{")
        if start < 0:
            self.last_error = "no JSON in output"
            return None
        try:
            return json.loads(out[start:])
        except ValueError:
            self.last_error = "unreadable output"
            if record:
                self.failures.append("%s: unreadable output" % (label or argv[0]))
            return None

    def prog(self, name):
        return os.path.join(self.build, name)

    def cluster_args(self, big=False):
        """Options every cluster benchmark takes (dyad-transfer, dyad-small-files);
        `big` for the large-file runs, which use self.big_tmp."""
        tmp = self.big_tmp if big else self.tmp
        return ["--tmp", tmp] if tmp else []


# --- sections ---------------------------------------------------------------


def big_file_dir(largest):
    """Where the large-file runs keep node files: /dev/shm when it holds three
    copies of the largest file with room to spare (on a disk, dirty-page
    writeback makes the raw file-to-file baseline swing by 3x between runs),
    otherwise the default temporary directory."""
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > 3 * largest + 2 * GiB and os.access("/dev/shm", os.W_OK):
            return "/dev/shm"
    except OSError:
        pass
    return None


# Transfer modes: what dyad-transfer --mode gets, and the environment added
# for the run. "UCX-SHM" is the UCX transport allowed to use shared memory:
# both emulated nodes share this host's memory, and the owner's service
# writes file chunks straight into the requester service's shared buffer
# (the same-host direct path, counted in the owner's bytes.out.direct).
# "OFI" is the libfabric transport over its tcp provider (tcp;ofi_rxm), and
# "OFI-SHM" the same over libfabric's shm provider.
KNOWN_MODES = ["TCP", "UCX", "UCX-SHM", "OFI", "OFI-SHM"]
UCX_SHM_TLS = "shm,tcp"
OFI_PROVIDERS = {"OFI": "tcp", "OFI-SHM": "shm"}
MODE_DESCRIPTIONS = {
    "UCX-SHM": "UCX-SHM is the UCX transport with UCX_TLS=%s: both emulated nodes share this "
               "host's memory, so the owner's service writes file chunks straight into the "
               "requester service's shared buffer (the same-host direct path; the owner's "
               "bytes.out.direct counter)." % UCX_SHM_TLS,
    "OFI": "OFI is the libfabric transport with FI_PROVIDER=tcp (tcp;ofi_rxm): the requester's "
           "service reads each chunk with fi_read from the owner service's registered memory "
           "over TCP between the namespaces.",
    "OFI-SHM": "OFI-SHM is the libfabric transport with FI_PROVIDER=shm: the same RMA reads "
               "between the two services through shared memory and cross-memory attach (both "
               "emulated nodes are processes of this host).",
}


def ucx_env():
    # On one machine without InfiniBand, UCX runs over TCP.
    return {"UCX_TLS": os.environ.get("UCX_TLS", "tcp")}


def mode_argv(mode):
    """dyad-transfer options selecting `mode`'s transport."""
    if mode == "TCP":
        return []
    return ["--mode", {"UCX-SHM": "UCX", "OFI-SHM": "OFI"}.get(mode, mode)]


def mode_env(mode):
    """Environment added to dyad-transfer's for `mode` (None: unchanged)."""
    if mode == "UCX":
        return ucx_env()
    if mode == "UCX-SHM":
        return {"UCX_TLS": UCX_SHM_TLS}
    if mode in OFI_PROVIDERS:
        return {"FI_PROVIDER": OFI_PROVIDERS[mode]}
    return None


def parse_modes(text):
    """--modes: a comma-separated list; known names in any case (ucx-shm ->
    UCX-SHM), anything else passed to dyad-transfer --mode as given."""
    modes = []
    for m in (x.strip() for x in text.split(",")):
        if not m:
            continue
        m = next((k for k in KNOWN_MODES if k.lower() == m.lower()), m)
        if m not in modes:
            modes.append(m)
    return modes


def detect_modes(r, requested):
    """(transports to measure, {mode: why it was skipped}). TCP always; UCX
    when built and working; UCX-SHM when a probe with UCX_TLS=shm,tcp works
    and shows that the owner's service used the direct path."""
    if requested:
        return requested, {}
    modes = ["TCP"]
    skipped = {}
    probe = r.json_of([r.prog("dyad-transfer"), "--size-mib", "1", "--reps", "1", "--mode",
                       "UCX", "--json"] + r.cluster_args(), 60, ucx_env(),
                      label="probe: UCX transport")
    if probe and probe.get("median", {}).get("dyad_mbps", 0) > 0:
        modes.append("UCX")
    else:
        skipped["UCX"] = "1 MiB probe with UCX_TLS=%s failed (%s)" % (
            ucx_env()["UCX_TLS"], r.last_error or "no DYAD throughput")
    probe = r.json_of([r.prog("dyad-transfer"), "--size-mib", "1", "--reps", "1", "--json"]
                      + mode_argv("UCX-SHM") + r.cluster_args(), 60, mode_env("UCX-SHM"),
                      label="probe: UCX transport, UCX_TLS=%s" % UCX_SHM_TLS, record=False)
    if not probe or not probe.get("median", {}).get("dyad_mbps", 0) > 0:
        skipped["UCX-SHM"] = "1 MiB probe with UCX_TLS=%s failed (%s)" % (
            UCX_SHM_TLS, r.last_error or "no DYAD throughput")
    elif "owner_bytes_out_direct" not in probe:
        skipped["UCX-SHM"] = ("1 MiB probe with UCX_TLS=%s: dyad-transfer does not report "
                              "owner_bytes_out_direct (old build?)" % UCX_SHM_TLS)
    elif not probe.get("owner_bytes_out_direct"):
        skipped["UCX-SHM"] = ("1 MiB probe with UCX_TLS=%s worked but did not use the direct "
                              "path (owner bytes.out %s, bytes.out.direct %s)" % (
                                  UCX_SHM_TLS, probe.get("owner_bytes_out"),
                                  probe.get("owner_bytes_out_direct")))
    else:
        modes.append("UCX-SHM")
    for mode, provider in OFI_PROVIDERS.items():
        probe = r.json_of([r.prog("dyad-transfer"), "--size-mib", "1", "--reps", "1", "--json"]
                          + mode_argv(mode) + r.cluster_args(), 60, mode_env(mode),
                          label="probe: OFI transport, FI_PROVIDER=%s" % provider, record=False)
        details = (probe or {}).get("transport_details") or ""
        if not probe or not probe.get("median", {}).get("dyad_mbps", 0) > 0:
            skipped[mode] = "1 MiB probe with FI_PROVIDER=%s failed (%s)" % (
                provider, r.last_error or "no DYAD throughput")
        elif ("provider " + provider) not in details:
            skipped[mode] = "1 MiB probe with FI_PROVIDER=%s used another path (%s)" % (
                provider, details or "no transport details")
        else:
            modes.append(mode)
    return modes, skipped


def section_transfer(r, prof, quick, modes):
    rows = []
    for mode in modes:
        for size in prof["transfer_sizes"]:
            reps = transfer_reps(size, quick)
            argv = [r.prog("dyad-transfer"), "--size", str(size), "--reps", str(reps),
                    "--json"] + r.cluster_args(big=True) + mode_argv(mode)
            env = mode_env(mode)
            j = r.json_of(argv, 120 + size // (20 * MiB), env,
                          label="transfer %s %s x%d" % (mode, human(size), reps))
            row = {"mode": mode, "bytes": size, "reps": reps, "ok": j is not None,
                   "ucx_tls": (env or {}).get("UCX_TLS"),
                   "fi_provider": (env or {}).get("FI_PROVIDER")}
            if j:
                med = j["median"]
                res = j.get("resources", {})
                row.update({
                    "link": j.get("link"),
                    "raw_mem_mbps": med["raw_mem_mbps"],
                    "raw_file_mbps": med["raw_file_mbps"],
                    "dyad_mbps": med["dyad_mbps"],
                    "ratio_raw_mem": j["ratio_dyad_raw_mem"],
                    "ratio_raw_file": j["ratio_dyad_raw_file"],
                    "publish_ms": j["publish_ms_median"],
                    "service_hwm_kib": res.get("service_hwm_kib"),
                    "consumer_hwm_kib": res.get("consumer_hwm_kib"),
                    "cpu_s_per_gib": res.get("cpu_s_per_gib_median"),
                    "owner_bytes_out": j.get("owner_bytes_out"),
                    "owner_bytes_out_direct": j.get("owner_bytes_out_direct"),
                    "transport_details": j.get("transport_details"),
                    "raw": j,
                })
            rows.append(row)
    return rows


def section_small(r, prof):
    rows = []
    lat_files = {}
    for size in prof["small_sizes"]:
        count = max(100, min(prof["small_count"], prof["small_bytes_cap"] // size))
        lat_dyad = os.path.join(r.out, "latency-dyad-%d.txt" % size)
        lat_poll = os.path.join(r.out, "latency-poll-%d.txt" % size)
        lat_call = os.path.join(r.out, "latency-dyad-call-%d.txt" % size)
        # The asynchronous publish rows (plain write+close, DYAD_ASYNC_PUBLISH,
        # synchronous; node A alone) for 4 KiB files only.
        # The chain baseline of the consume (issue 28) for 4 KiB files only.
        phases = "publish,after,streaming" + (",chain,async" if size == 4096 else "")
        d = r.json_of([r.prog("dyad-small-files"), "--count", str(count), "--size", str(size),
                       "--phases", phases, "--latencies", lat_dyad,
                       "--call-latencies", lat_call, "--json"]
                      + r.cluster_args(),
                      180, label="small files DYAD %s x%d" % (human(size), count))
        p = r.json_of([r.prog("dyad-poll-baseline"), "--count", str(count), "--size", str(size),
                       "--poll-us", "1000", "--latencies", lat_poll, "--json"]
                      + r.cluster_args(), 180,
                      label="small files polling %s x%d" % (human(size), count))
        row = {"bytes": size, "count": count, "ok": bool(d and p)}
        if d:
            row.update({
                "dyad_stream_fps": d["streaming"]["files_per_s"],
                "dyad_stream_p50_ms": d["streaming"]["latency_p50_ms"],
                "dyad_stream_p99_ms": d["streaming"]["latency_p99_ms"],
                "dyad_after_fps": d["consume_after"]["files_per_s"],
                "dyad_after_p50_ms": d["consume_after"]["p50_ms"],
                "dyad_after_p99_ms": d["consume_after"]["p99_ms"],
                "publish_fps": d["publish"]["files_per_s"],
                "failures": sum(d[k]["failures"] for k in ("publish", "consume_after",
                                                           "streaming")),
            })
            cost = d.get("consume_after_cost") or {}
            if cost.get("ok"):
                row.update({"after_switches": cost["switches"], "after_cpu_us": cost["cpu_us"],
                            "after_cost": cost})
            ch = d.get("chain") or {}
            if ch.get("ran"):
                row.update({"chain_fps": ch["files_per_s"],
                            "ratio_after_chain": ch["ratio_after_chain"]})
                if (ch.get("cost") or {}).get("ok"):
                    row.update({"chain_switches": ch["cost"]["switches"],
                                "chain_cpu_us": ch["cost"]["cpu_us"]})
                row["failures"] += ch["failures"]
            a = d.get("async_publish") or {}
            if a.get("ran"):
                row.update({
                    "async_plain_fps": a["plain_files_per_s"],
                    "async_fps": a["async_files_per_s"],
                    "async_sync_fps": a["sync_files_per_s"],
                    "ratio_async_plain": a["ratio_async_plain"],
                    "async_finalize_ms": a["finalize_ms"],
                })
                row["failures"] += a["failures"]
        if p:
            row.update({
                "poll_fps": p["streaming"]["files_per_s"],
                "poll_p50_ms": p["streaming"]["latency_p50_ms"],
                "poll_p99_ms": p["streaming"]["latency_p99_ms"],
            })
        row["ratio_fps"] = ratio(row.get("dyad_stream_fps"), row.get("poll_fps"))
        row["ratio_after_fps"] = ratio(row.get("dyad_after_fps"), row.get("poll_fps"))
        rows.append(row)
        lat_files[size] = (lat_dyad, lat_poll, lat_call)
    return rows, lat_files


def section_prefetch(r, prof):
    """Prefetch on publication (dyad-prefetch) and the DataLoader look-ahead
    (python/bench/dataloader_bench.py), each against its baseline in the
    same run."""
    res = {}
    count = prof["prefetch_count"]
    d = r.json_of([r.prog("dyad-prefetch"), "--count", str(count), "--json"] + r.cluster_args(),
                  300, label="prefetch 4 KiB x%d" % count)
    if d:
        res.update({
            "count": count,
            "after_fps": d["after"]["files_per_s"],
            "tmpfs_fps": d["after"]["tmpfs_files_per_s"],
            "ratio_after_tmpfs": d["after"]["ratio"],
            "service_requests": d["after"]["service_requests"],
            "stream_fps": d["streaming"]["files_per_s"],
            "producer_fps": d["streaming"]["producer_files_per_s"],
            "ratio_stream_producer": d["streaming"]["ratio"],
            "backlog_fps": d["backlog"]["files_per_s"],
            "backlog_producer_fps": d["backlog"]["producer_files_per_s"],
            "failures": d["failures"],
        })
    # The same consumes from the node's one managed directory (producer =
    # consumer directory, as docs/deployment.md sets nodes up).
    d = r.json_of([r.prog("dyad-prefetch"), "--count", str(count), "--json", "--phases", "after",
                   "--layout", "shared"] + r.cluster_args(),
                  300, label="prefetch 4 KiB x%d, one managed directory" % count)
    if d:
        res.update({
            "shared_after_fps": d["after"]["files_per_s"],
            "shared_tmpfs_fps": d["after"]["tmpfs_files_per_s"],
            "ratio_shared_after_tmpfs": d["after"]["ratio"],
            "shared_service_requests": d["after"]["service_requests"],
            "shared_preload_fps": d["after"].get("preload_files_per_s"),
            "ratio_shared_preload_tmpfs": d["after"].get("preload_ratio"),
        })
        res["failures"] = res.get("failures", 0) + d["failures"]
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "..", "python", "bench", "dataloader_bench.py")
    if not os.path.isdir(os.path.join(r.build, "python", "pydyad")):
        res["dataloader_skipped"] = "pydyad not built"
        return res
    env = {"PYTHONPATH": os.path.join(r.build, "python"), "DYAD_BUILD_DIR": r.build}
    node_dir = ["--node-dir", r.tmp] if r.tmp else []  # the nodes' directories, as for the others
    j = r.json_of(["/usr/bin/python3", script, "--json"] + node_dir + prof["dataloader"], 600,
                  env_extra=env, label="dataloader look-ahead")
    if j:
        rows = {(x["reader"], x["epoch"]): x["samples_per_s"] for x in j["rows"]}
        e1, e2 = rows.get(("dyad node 1", 1)), rows.get(("dyad node 1", 2))
        res.update({"dl_epoch1_sps": e1, "dl_epoch2_sps": e2, "ratio_dl": ratio(e1, e2),
                    "dl_lookahead": j["lookahead"]})
    return res


def section_small_modes(r, prof, modes, small):
    """Small files over each transport other than the default (TCP): DYAD
    streaming and consume-after rates at a few sizes, against the polling
    baseline of the same size measured by section_small in this run."""
    rows = []
    for mode in modes:
        if mode == "TCP":
            continue
        for size in prof["small_mode_sizes"]:
            count = max(100, min(prof["small_count"], prof["small_bytes_cap"] // size))
            d = r.json_of([r.prog("dyad-small-files"), "--count", str(count), "--size",
                           str(size), "--phases", "after,streaming", "--json"]
                          + r.cluster_args() + mode_argv(mode), 180, mode_env(mode),
                          label="small files DYAD %s %s x%d" % (mode, human(size), count))
            base = next((s for s in small if s["bytes"] == size), {})
            row = {"mode": mode, "bytes": size, "count": count, "ok": d is not None,
                   "poll_fps": base.get("poll_fps"), "tcp_after_fps": base.get("dyad_after_fps")}
            if d:
                row.update({
                    "dyad_stream_fps": d["streaming"]["files_per_s"],
                    "dyad_stream_p50_ms": d["streaming"]["latency_p50_ms"],
                    "dyad_after_fps": d["consume_after"]["files_per_s"],
                    "dyad_after_p50_ms": d["consume_after"]["p50_ms"],
                    "failures": sum(d[k]["failures"] for k in ("consume_after", "streaming")),
                })
            row["ratio_fps"] = ratio(row.get("dyad_stream_fps"), row.get("poll_fps"))
            row["ratio_after_tcp"] = ratio(row.get("dyad_after_fps"), row.get("tcp_after_fps"))
            rows.append(row)
    return rows


def section_metadata(r, prof):
    j = r.json_of([r.prog("dyad-metadata"), "--n", str(prof["metadata_n"]), "--json"], 240,
                  label="metadata n=%d" % prof["metadata_n"])
    return j.get("results", []) if j else []


def section_preload(r, prof):
    rc, out = r.run([r.prog("dyad-preload-overhead")] + prof["preload"], 240,
                    label="preload overhead")
    rows = []
    for line in out.splitlines():
        m = re.match(r"^(\S.*?)\s{2,}([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
        if m:
            rows.append({"call": m.group(1), "without_ns": float(m.group(2)),
                         "with_ns": float(m.group(3)), "ratio": float(m.group(4))})
    return rows


def section_scaling(r, prof):
    consumers = []
    for k in prof["consumers"]:
        j = r.json_of([r.prog("dyad-small-files"), "--count", str(prof["consumer_count"]),
                       "--size", str(prof["consumer_file"]), "--consumers", str(k),
                       "--phases", "parallel", "--json"] + r.cluster_args(), 180,
                      label="scaling: %d consumers, %s files" % (k, human(prof["consumer_file"])))
        row = {"consumers": k, "ok": j is not None}
        if j:
            par = j["consume_parallel"]
            row.update({"files_per_s": par["files_per_s"],
                        "mbps": par["files_per_s"] * prof["consumer_file"] / 1e6,
                        "p50_ms": par["p50_ms"], "p99_ms": par["p99_ms"],
                        "failures": par["failures"]})
        consumers.append(row)
    base = consumers[0].get("mbps") if consumers else None
    for row in consumers:
        row["ratio_vs_1"] = ratio(row.get("mbps"), base)
    nodes = []
    for n in prof["ring_nodes"]:
        j = r.json_of([r.prog("dyad-transfer"), "--ring", str(n), "--size",
                       str(prof["ring_size"]), "--reps", str(prof["ring_reps"]), "--json"]
                      + r.cluster_args(big=True),
                      120 + n * prof["ring_size"] * prof["ring_reps"] // (10 * MiB),
                      label="scaling: ring of %d nodes, %s each" % (n, human(prof["ring_size"])))
        row = {"nodes": n, "ok": j is not None}
        if j:
            row.update({"raw_mbps": j["median"]["raw_aggregate_mbps"],
                        "dyad_mbps": j["median"]["dyad_aggregate_mbps"],
                        "ratio": j["ratio_dyad_raw"]})
        nodes.append(row)
    return consumers, nodes


# --- plots --------------------------------------------------------------------


def read_values(path):
    try:
        with open(path) as f:
            return sorted(float(x) for x in f if x.strip())
    except OSError:
        return []


def plot_all(out, transfer, small, lat_files, consumers, nodes, errors):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = {}
    modes = sorted({t["mode"] for t in transfer})

    # Throughput vs size, per transport, with the raw TCP lines.
    def plot_transfer():
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        modes = sorted({t["mode"] for t in transfer})
        first = [t for t in transfer if t["mode"] == modes[0] and t["ok"]] if modes else []
        if first:
            xs = [t["bytes"] / MiB for t in first]
            ax.plot(xs, [t["raw_mem_mbps"] for t in first], "k--", marker="s",
                    label="raw TCP, memory")
            ax.plot(xs, [t["raw_file_mbps"] for t in first], "k:", marker="s",
                    label="raw TCP, file->file")
        for i, mode in enumerate(modes):
            rows = [t for t in transfer if t["mode"] == mode and t["ok"]]
            xs = [t["bytes"] / MiB for t in rows]
            color = "C%d" % i  # one colour per transport in both panels
            ax.plot(xs, [t["dyad_mbps"] for t in rows], marker="o", color=color,
                    label="DYAD %s" % mode)
            ax2.plot(xs, [t["ratio_raw_file"] for t in rows], marker="o", color=color,
                     label="DYAD %s / raw file->file" % mode)
            ax2.plot(xs, [t["ratio_raw_mem"] for t in rows], marker="x", linestyle="--",
                     color=color, label="DYAD %s / raw memory" % mode)
        for a in (ax, ax2):
            a.set_xscale("log", base=2)
            a.set_xlabel("file size (MiB)")
            a.grid(True, alpha=0.3)
        ax.set_ylabel("MB/s")
        ax.set_title("Large-file transfer between two emulated nodes")
        ax.legend(fontsize=8)
        ax2.axhline(0.9, color="red", linewidth=0.8, label="target 0.9")
        ax2.set_ylabel("ratio")
        ax2.set_title("DYAD / raw TCP")
        ax2.legend(fontsize=8)
        fig.tight_layout()
        figs["transfer"] = "transfer_throughput.png"
        fig.savefig(os.path.join(out, figs["transfer"]), dpi=110)
        plt.close(fig)


    # Small files: latency CDFs and rates.
    def plot_small():
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        ax = axes[0]
        colors = {4096: "tab:blue", MiB: "tab:orange"}
        for size, (ld, lp, lc) in sorted(lat_files.items()):
            if size not in colors:
                continue
            for path, name, style in ((ld, "DYAD streaming", "-"), (lp, "polling dir", "--"),
                                      (lc, "DYAD consume call, after", ":")):
                v = read_values(path)
                if v:
                    ys = [(i + 1) / len(v) for i in range(len(v))]
                    ax.plot(v, ys, style, color=colors[size],
                            label="%s, %s files" % (name, human(size)))
        ax.set_xscale("log")
        ax.set_xlabel("ms: publish/rename -> consumer has the file; or one consume call")
        ax.set_ylabel("fraction of files")
        ax.set_title("Small files: latency CDF")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        ax = axes[1]
        ok = [s for s in small if s.get("dyad_stream_fps")]
        xs = [s["bytes"] / 1024 for s in ok]
        ax.plot(xs, [s["dyad_stream_fps"] for s in ok], marker="o", label="DYAD streaming")
        ax.plot(xs, [s.get("dyad_after_fps") for s in ok], marker="o",
                label="DYAD consume after publish")
        ax.plot(xs, [s.get("poll_fps") for s in ok], "k--", marker="s",
                label="shared dir + polling consumer")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("file size (KiB)")
        ax.set_ylabel("files/s")
        ax.set_title("Small files: rate")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        figs["small"] = "small_files.png"
        fig.savefig(os.path.join(out, figs["small"]), dpi=110)
        plt.close(fig)


    # Scaling.
    def plot_scaling():
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        ok = [c for c in consumers if c.get("mbps")]
        ax.plot([c["consumers"] for c in ok], [c["mbps"] for c in ok], marker="o",
                label="DYAD aggregate")
        if ok:
            ax.plot([c["consumers"] for c in ok], [ok[0]["mbps"]] * len(ok), "k:",
                    label="1 consumer")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xticks([c["consumers"] for c in ok])
        ax.set_xticklabels([str(c["consumers"]) for c in ok])
        ax.set_xlabel("concurrent consumer processes on one node")
        ax.set_ylabel("aggregate MB/s")
        ax.set_title("Scaling: consumers")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        ok = [n for n in nodes if n.get("dyad_mbps")]
        ax2.plot([n["nodes"] for n in ok], [n["dyad_mbps"] for n in ok], marker="o",
                 label="DYAD ring")
        ax2.plot([n["nodes"] for n in ok], [n["raw_mbps"] for n in ok], "k--", marker="s",
                 label="raw TCP ring")
        ax2.set_ylim(bottom=0)
        ax2.set_xticks([n["nodes"] for n in ok])
        ax2.set_xlabel("emulated nodes (each sends one file to the next)")
        ax2.set_ylabel("aggregate MB/s")
        ax2.set_title("Scaling: nodes")
        ax2.grid(True, alpha=0.3)
        ax2.legend(fontsize=8)
        fig.tight_layout()
        figs["scaling"] = "scaling.png"
        fig.savefig(os.path.join(out, figs["scaling"]), dpi=110)
        plt.close(fig)


    # Resources vs file size.
    def plot_resources():
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for mode in modes:
            rows = [t for t in transfer if t["mode"] == mode and t["ok"] and t.get("service_hwm_kib")]
            xs = [t["bytes"] / MiB for t in rows]
            ax.plot(xs, [max(t["service_hwm_kib"]) / 1024 for t in rows], marker="o",
                    label="service peak RSS (%s)" % mode)
            ax.plot(xs, [t["consumer_hwm_kib"] / 1024 for t in rows], marker="x", linestyle="--",
                    label="consumer peak RSS (%s)" % mode)
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("file moved (MiB)")
        ax.set_ylabel("peak RSS (MiB)")
        ax.set_title("Memory while moving one file")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        figs["resources"] = "resources.png"
        fig.savefig(os.path.join(out, figs["resources"]), dpi=110)
        plt.close(fig)

    have_transfer = any(t["ok"] for t in transfer)
    for name, fn, have in (
            ("transfer", plot_transfer, have_transfer),
            ("small", plot_small, any(s.get("dyad_stream_fps") for s in small)),
            ("scaling", plot_scaling, any(c.get("mbps") for c in consumers) or
             any(n.get("dyad_mbps") for n in nodes)),
            ("resources", plot_resources, have_transfer)):
        if not have:
            continue
        try:
            fn()
        except Exception as e:  # one figure failing must not lose the others
            errors.append("plot %s: %s" % (name, e))
            plt.close("all")
    return figs


# --- report -------------------------------------------------------------------


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(r) + " |")
    return "\n".join(lines) + "\n"


def find_meta(meta, level, op_prefix):
    for m in meta:
        if m.get("level") == level and m.get("op", "").startswith(op_prefix):
            return m
    return None


def headline(res):
    rows = []
    for mode in res["modes"]:
        ok = [t for t in res["transfer"] if t["mode"] == mode and t["ok"]]
        if ok:
            big = ok[-1]
            rows.append(["Large file %s, %s: DYAD / raw TCP file->file" % (mode, human(big["bytes"])),
                         fmt(big["ratio_raw_file"], 2),
                         "%s vs %s MB/s (raw memory %s)" % (fmt(big["dyad_mbps"]),
                                                            fmt(big["raw_file_mbps"]),
                                                            fmt(big["raw_mem_mbps"])),
                         ">= 0.9"])
    s4 = next((s for s in res["small"] if s["bytes"] == 4096), None)
    if s4:
        rows.append(["4 KiB files streaming: DYAD / polling shared dir (files/s)",
                     fmt(s4.get("ratio_fps"), 2),
                     "%s vs %s files/s" % (fmt(s4.get("dyad_stream_fps"), 0),
                                           fmt(s4.get("poll_fps"), 0)), ""])
        rows.append(["4 KiB files streaming: p50 latency DYAD / polling",
                     fmt(ratio(s4.get("dyad_stream_p50_ms"), s4.get("poll_p50_ms")), 2),
                     "%s vs %s ms (p99 %s vs %s)" % (
                         fmt(s4.get("dyad_stream_p50_ms"), 3), fmt(s4.get("poll_p50_ms"), 3),
                         fmt(s4.get("dyad_stream_p99_ms"), 3), fmt(s4.get("poll_p99_ms"), 3)),
                     ""])
        if s4.get("ratio_async_plain") is not None:
            rows.append(["4 KiB publish, DYAD_ASYNC_PUBLISH=1 / plain write+close (files/s)",
                         fmt(s4.get("ratio_async_plain"), 2),
                         "%s vs %s files/s (synchronous %s)" % (
                             fmt(s4.get("async_fps"), 0), fmt(s4.get("async_plain_fps"), 0),
                             fmt(s4.get("async_sync_fps"), 0)),
                         ">= 0.5"])
        if s4.get("ratio_after_chain") is not None:
            rows.append(["4 KiB consume after publish / minimal blocking-socket chain",
                         fmt(s4.get("ratio_after_chain"), 2),
                         "%s vs %s files/s (same two round trips and file creation)" % (
                             fmt(s4.get("dyad_after_fps"), 0), fmt(s4.get("chain_fps"), 0)),
                         ">= 0.5"])
        if s4.get("after_switches") is not None:
            c = s4["after_cost"]
            rows.append(["4 KiB consume: context switches per consume, all processes",
                         fmt(s4["after_switches"], 2),
                         "consumer %s, node B %s, node A %s; CPU %s us per consume "
                         "(minimal chain: %s switches, %s us)" % (
                             fmt(c["consumer"]["switches"], 2), fmt(c["requester"]["switches"], 2),
                             fmt(c["owner"]["switches"], 2), fmt(s4["after_cpu_us"], 0),
                             fmt(s4.get("chain_switches"), 2), fmt(s4.get("chain_cpu_us"), 0)),
                         "<= 4"])
        rows.append(["4 KiB files consumed after publish: DYAD files/s / 5,000 target",
                     fmt(ratio(s4.get("dyad_after_fps"), 5000.0), 2),
                     "%s files/s (upstream 250-520)" % fmt(s4.get("dyad_after_fps"), 0),
                     ">= 1"])
    pf = res.get("prefetch") or {}
    if pf.get("after_fps"):
        rows.append(["4 KiB files with prefetch: consume+read / plain tmpfs read",
                     fmt(pf.get("ratio_after_tmpfs"), 2),
                     "%s vs %s files/s" % (fmt(pf["after_fps"], 0), fmt(pf["tmpfs_fps"], 0)),
                     ">= 0.8"])
    if pf.get("shared_after_fps"):
        rows.append(["The same, one managed directory: consume+read / plain tmpfs read",
                     fmt(pf.get("ratio_shared_after_tmpfs"), 2),
                     "%s vs %s files/s" % (fmt(pf["shared_after_fps"], 0),
                                           fmt(pf["shared_tmpfs_fps"], 0)),
                     ">= 0.8"])
    if pf.get("after_fps"):
        rows.append(["Streaming with prefetch: end to end / producer publish rate",
                     fmt(pf.get("ratio_stream_producer"), 2),
                     "%s vs %s files/s" % (fmt(pf["stream_fps"], 0), fmt(pf["producer_fps"], 0)),
                     ">= 0.9"])
    if pf.get("ratio_dl") is not None:
        rows.append(["DataLoader node 1: epoch 1 (look-ahead %s) / epoch 2 (local)" %
                     pf.get("dl_lookahead"), fmt(pf["ratio_dl"], 2),
                     "%s vs %s samples/s" % (fmt(pf["dl_epoch1_sps"], 0),
                                             fmt(pf["dl_epoch2_sps"], 0)), ">= 0.8"])
    hit = find_meta(res["metadata"], "service/embedded", "locate (cache hit)")
    miss = find_meta(res["metadata"], "service/embedded", "locate (cache miss)")
    if hit and miss:
        rows.append(["Metadata locate p50: cache hit / miss (embedded)",
                     fmt(ratio(hit["p50_us"], miss["p50_us"]), 2),
                     "%s vs %s us" % (fmt(hit["p50_us"]), fmt(miss["p50_us"])), ""])
    pre = next((p for p in res["preload"] if p["call"].startswith("open+close (separate")), None)
    if pre:
        rows.append(["Interception overhead, open+close outside managed dirs",
                     fmt(pre["ratio"], 3),
                     "%s vs %s ns" % (fmt(pre["with_ns"]), fmt(pre["without_ns"])), "<= 1.05"])
    cons = [c for c in res["scaling_consumers"] if c.get("mbps")]
    if len(cons) > 1:
        rows.append(["Scaling: %d consumers / 1 consumer (aggregate)" % cons[-1]["consumers"],
                     fmt(cons[-1]["ratio_vs_1"], 2),
                     "%s vs %s MB/s" % (fmt(cons[-1]["mbps"]), fmt(cons[0]["mbps"])), ""])
    nodes = [n for n in res["scaling_nodes"] if n.get("dyad_mbps")]
    if nodes:
        n = nodes[-1]
        rows.append(["Scaling: ring of %d nodes, DYAD / raw TCP (aggregate)" % n["nodes"],
                     fmt(n["ratio"], 2),
                     "%s vs %s MB/s" % (fmt(n["dyad_mbps"]), fmt(n["raw_mbps"])), ""])
    tcp = [t for t in res["transfer"] if t["mode"] == "TCP" and t["ok"] and
           t.get("service_hwm_kib")]
    if len(tcp) > 1:
        lo, hi = tcp[0], tcp[-1]
        rows.append(["Service peak RSS: %s file / %s file" % (human(hi["bytes"]),
                                                              human(lo["bytes"])),
                     fmt(ratio(max(hi["service_hwm_kib"]), max(lo["service_hwm_kib"])), 2),
                     "%s vs %s MiB" % (fmt(max(hi["service_hwm_kib"]) / 1024),
                                       fmt(max(lo["service_hwm_kib"]) / 1024)),
                     "~1 (independent of size)"])
        rows.append(["CPU seconds per GiB moved (services + consumer, TCP, %s)" %
                     human(hi["bytes"]), fmt(hi.get("cpu_s_per_gib"), 3), "", ""])
    return table(["headline", "ratio / value", "measured", "target"], rows)


def direct_share(t):
    """The owner's bytes.out.direct as a share of its bytes.out, for a table."""
    out, direct = t.get("owner_bytes_out"), t.get("owner_bytes_out_direct")
    if out is None or direct is None:
        return "n/a"
    return "%d%%" % round(100.0 * direct / out) if out else "0%"


def write_report(out, res, figs):
    L = []
    L.append("# DYAD benchmark report (%s run)\n" % res["profile"])
    L.append("%s, host %s, %d CPUs, commit %s, elapsed %.0f s. Link: %s. Transports: %s. "
             "Node directories under %s (large-file and ring runs: %s).\n" % (
                 res["date"], res["host"], res["cpus"], res["commit"], res["elapsed_s"],
                 res.get("link") or "n/a", ", ".join(res["modes"]), res["tmp"],
                 res["big_tmp"]))
    L.append("Every figure is a ratio to a baseline measured in this same run; absolute "
             "numbers on shared machines drift. See docs/performance.md.\n")
    if res.get("modes_skipped"):
        L.append("Transports not measured: " + "; ".join(
            "%s: %s" % (m, why) for m, why in sorted(res["modes_skipped"].items())) + ".\n")
    if res["failures"]:
        L.append("**Failed measurements:** " + "; ".join(res["failures"]) + "\n")
    L.append("## Summary\n")
    L.append(headline(res))
    L += ["* " + line for line in metadata_section.headline(res)]

    L.append("\n## Large-file transfer (two emulated nodes)\n")
    L.append("Median MB/s of the consumer's dyad_consume call versus a plain TCP sender/receiver "
             "between the same two nodes (memory to memory, and sendfile() from the producer's "
             "file to write() into the consumer's directory). 'direct' is the share of the "
             "owner service's bytes.out that went through the same-host direct path "
             "(bytes.out.direct).\n")
    for mode in res["modes"]:
        if mode in MODE_DESCRIPTIONS:
            L.append(MODE_DESCRIPTIONS[mode] + "\n")
    rows = []
    for t in res["transfer"]:
        if not t["ok"]:
            rows.append([t["mode"], human(t["bytes"]), str(t["reps"])] + ["failed"] + [""] * 8)
            continue
        rows.append([t["mode"], human(t["bytes"]), str(t["reps"]), fmt(t["raw_mem_mbps"]),
                     fmt(t["raw_file_mbps"]), fmt(t["dyad_mbps"]), fmt(t["ratio_raw_mem"], 2),
                     fmt(t["ratio_raw_file"], 2), fmt(t["publish_ms"], 3),
                     "%s / %s" % (fmt(max(t["service_hwm_kib"]) / 1024),
                                  fmt(t["consumer_hwm_kib"] / 1024)),
                     fmt(t.get("cpu_s_per_gib"), 3), direct_share(t)])
    L.append(table(["transport", "size", "reps", "raw mem MB/s", "raw file MB/s", "DYAD MB/s",
                    "DYAD/raw mem", "DYAD/raw file", "publish ms", "peak RSS MiB svc / cons",
                    "CPU s/GiB", "direct"], rows))
    for key in ("transfer", "resources"):
        if key in figs:
            L.append("\n![%s](%s)\n" % (key, figs[key]))

    L.append("\n## Many small files\n")
    L.append("DYAD streaming: the consumer on node B waits for each file before the producer on "
             "node A starts; latency from the publish returning to the consume returning. "
             "Baseline: the same exchange through one shared local directory, the producer "
             "writing then renaming each file, the consumer polling stat() every 1 ms. "
             "'after' is DYAD consumption once the producer has finished.\n")
    rows = []
    for s in res["small"]:
        rows.append([human(s["bytes"]), str(s["count"]), fmt(s.get("dyad_stream_fps"), 0),
                     fmt(s.get("poll_fps"), 0), fmt(s.get("ratio_fps"), 2),
                     "%s / %s" % (fmt(s.get("dyad_stream_p50_ms"), 3),
                                  fmt(s.get("dyad_stream_p99_ms"), 3)),
                     "%s / %s" % (fmt(s.get("poll_p50_ms"), 3), fmt(s.get("poll_p99_ms"), 3)),
                     fmt(s.get("dyad_after_fps"), 0),
                     "%s / %s" % (fmt(s.get("dyad_after_p50_ms"), 3),
                                  fmt(s.get("dyad_after_p99_ms"), 3)),
                     fmt(s.get("publish_fps"), 0), str(s.get("failures", "n/a"))])
    L.append(table(["size", "files", "DYAD stream files/s", "polling files/s", "ratio",
                    "DYAD p50/p99 ms", "polling p50/p99 ms", "DYAD after files/s",
                    "after p50/p99 ms", "publish files/s", "errors"], rows))
    for s in res["small"]:
        if s.get("ratio_async_plain") is None:
            continue
        L.append("\nAsynchronous publication (%s files, node A alone, medians of alternated "
                 "runs): write+close %s files/s; with DYAD_ASYNC_PUBLISH=1 %s files/s "
                 "(ratio %s, target >= 0.5; dyad_finalize then waited %s ms); synchronous "
                 "publish %s files/s.\n" % (
                     human(s["bytes"]), fmt(s.get("async_plain_fps"), 0),
                     fmt(s.get("async_fps"), 0), fmt(s.get("ratio_async_plain"), 2),
                     fmt(s.get("async_finalize_ms"), 1), fmt(s.get("async_sync_fps"), 0)))
    if "small" in figs:
        L.append("\n![small files](%s)\n" % figs["small"])
    if res.get("small_modes"):
        L.append("\nThe same exchange over the other transports (streaming and consume after "
                 "publish), against the polling baseline and the TCP transport's "
                 "consume-after rate of the same size in this run.\n")
        rows = []
        for s in res["small_modes"]:
            rows.append([s["mode"], human(s["bytes"]), str(s["count"]),
                         fmt(s.get("dyad_stream_fps"), 0), fmt(s.get("poll_fps"), 0),
                         fmt(s.get("ratio_fps"), 2), fmt(s.get("dyad_stream_p50_ms"), 3),
                         fmt(s.get("dyad_after_fps"), 0), fmt(s.get("ratio_after_tcp"), 2),
                         str(s.get("failures", "n/a"))])
        L.append(table(["transport", "size", "files", "DYAD stream files/s", "polling files/s",
                        "ratio", "DYAD stream p50 ms", "DYAD after files/s",
                        "after / TCP after", "errors"], rows))

    pf = res.get("prefetch") or {}
    if pf:
        L.append("\n## Prefetch on publication (dyad-prefetch, dataloader_bench.py)\n")
        L.append("The consumer declares what it reads (dyad_prefetch) before the producer "
                 "publishes; node B's service pulls each file as it is published, so consumes "
                 "are local. Baselines from the same run: a plain open/read/close of the same "
                 "files copied into tmpfs (best of 3), and the producer's own write+publish "
                 "rate. DataLoader: node 1's epoch 1 with look-ahead against its epoch 2 "
                 "(every sample local).\n")
        L.append(table(["row", "measured", "baseline", "ratio", "target"], [
            ["4 KiB x%s consumed after publication" % pf.get("count", "?"),
             fmt(pf.get("after_fps"), 0), fmt(pf.get("tmpfs_fps"), 0),
             fmt(pf.get("ratio_after_tmpfs"), 2), ">= 0.8"],
            ["the same from the one managed directory", fmt(pf.get("shared_after_fps"), 0),
             fmt(pf.get("shared_tmpfs_fps"), 0), fmt(pf.get("ratio_shared_after_tmpfs"), 2),
             ">= 0.8"],
            ["... read by an unmodified program under LD_PRELOAD",
             fmt(pf.get("shared_preload_fps"), 0), fmt(pf.get("shared_tmpfs_fps"), 0),
             fmt(pf.get("ratio_shared_preload_tmpfs"), 2), ">= 0.8"],
            ["streaming end to end", fmt(pf.get("stream_fps"), 0), fmt(pf.get("producer_fps"), 0),
             fmt(pf.get("ratio_stream_producer"), 2), ">= 0.9"],
            ["DataLoader epoch 1 (samples/s)", fmt(pf.get("dl_epoch1_sps"), 0),
             fmt(pf.get("dl_epoch2_sps"), 0), fmt(pf.get("ratio_dl"), 2), ">= 0.8"]]))
    L.append("\n## Metadata (dyad-metadata)\n")
    rows = [[m["level"], m["op"], str(m["n"]), fmt(m["p50_us"]), fmt(m["p99_us"]),
             fmt(m.get("ops_per_s"), 0)] for m in res["metadata"]]
    L.append(table(["store / level", "operation", "n", "p50 us", "p99 us", "ops/s"], rows))

    L.append("\n## Interception overhead (dyad-preload-overhead)\n")
    rows = [[p["call"], fmt(p["without_ns"]), fmt(p["with_ns"]), fmt(p["ratio"], 3)]
            for p in res["preload"]]
    L.append(table(["call pair (path outside managed dirs)", "without ns", "with preload ns",
                    "ratio"], rows))

    L.append("\n## Scaling\n")
    L.append("Consumers: one producer published the files first; N consumer processes on node "
             "B each take every N-th file; aggregate MB/s over the wall time of all of them.\n")
    rows = [[str(c["consumers"]), fmt(c.get("files_per_s"), 0), fmt(c.get("mbps")),
             fmt(c.get("ratio_vs_1"), 2),
             "%s / %s" % (fmt(c.get("p50_ms"), 3), fmt(c.get("p99_ms"), 3))]
            for c in res["scaling_consumers"]]
    L.append(table(["consumers", "files/s", "aggregate MB/s", "vs 1 consumer",
                    "per-file p50/p99 ms"], rows))
    L.append("\nNodes: N emulated nodes in a ring, node i's file consumed by node i+1, all at "
             "once, versus the same ring of raw TCP file-to-file streams.\n")
    rows = [[str(n["nodes"]), fmt(n.get("raw_mbps")), fmt(n.get("dyad_mbps")),
             fmt(n.get("ratio"), 2)] for n in res["scaling_nodes"]]
    L.append(table(["nodes", "raw TCP aggregate MB/s", "DYAD aggregate MB/s", "DYAD / raw"],
                   rows))
    if "scaling" in figs:
        L.append("\n![scaling](%s)\n" % figs["scaling"])
    L.extend(scale_section.report_lines(res.get("scale"), figs))
    L += [""] + metadata_section.report(res)
    L.append("\nRaw program output: run.log. Every number: results.json.\n")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(L))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build directory with the bench programs")
    ap.add_argument("--quick", action="store_true", help="smaller sizes and counts (< 2 min)")
    ap.add_argument("--out", help="output directory (default bench/results/<date>[-quick])")
    ap.add_argument("--modes", help="comma-separated transports: TCP, UCX (UCX_TLS=tcp unless "
                                    "set), UCX-SHM (UCX with UCX_TLS=%s, the same-host direct "
                                    "path), OFI (libfabric, FI_PROVIDER=tcp), OFI-SHM "
                                    "(libfabric, FI_PROVIDER=shm); default: TCP, plus the "
                                    "others when a 1 MiB probe of each works (UCX-SHM: and used "
                                    "the direct path; OFI*: and used that provider)"
                                    % UCX_SHM_TLS)
    ap.add_argument("--tmp", help="parent of the emulated nodes' directories (e.g. /dev/shm); "
                                  "default /dev/shm when it has room, else $TMPDIR or /tmp")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: transfer, "
                                               "small, prefetch, metadata, preload, scaling, "
                                               "scale, metadata-scale")
    args = ap.parse_args()

    t0 = time.monotonic()
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.path.abspath(args.build)
    needed = ["dyad-transfer", "dyad-small-files", "dyad-poll-baseline", "dyad-prefetch",
              "dyad-metadata",
              "dyad-preload-overhead", "dyad", "dyad-service"]
    missing = [n for n in needed if not os.access(os.path.join(build, n), os.X_OK)]
    if missing:
        sys.exit("run_bench: missing in %s: %s (build first: make build)" % (
            build, ", ".join(missing)))
    profile = "quick" if args.quick else "default"
    prof = PROFILES[profile]
    now = datetime.datetime.now()
    out = args.out or os.path.join(here, "results",
                                   now.strftime("%Y-%m-%d") + ("-quick" if args.quick else ""))
    os.makedirs(out, exist_ok=True)
    skip = set(x for x in args.skip.split(",") if x)
    env = dict(os.environ)
    env.setdefault("TMPDIR", "/tmp")
    r = Runner(build, out, env)
    # Node-local storage on HPC nodes is usually tmpfs or NVMe; here /tmp is a
    # VM disk whose inode allocator dominates file creation. Small-file runs
    # (DYAD and the polling baseline alike) therefore use /dev/shm too.
    r.tmp = args.tmp or big_file_dir(2 * GiB)
    r.big_tmp = args.tmp or big_file_dir(max(prof["transfer_sizes"] + [prof["ring_size"] * 4]))
    print("run_bench: %s run, results in %s" % (profile, out), flush=True)

    try:
        commit = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    res = {"profile": profile, "date": now.isoformat(timespec="seconds"),
           "host": platform.node(), "cpus": os.cpu_count() or 0, "commit": commit or "unknown",
           "build": build, "tmp": r.tmp or env["TMPDIR"],
           "big_tmp": r.big_tmp or env["TMPDIR"], "transfer": [], "small": [], "metadata": [], "preload": [],
           "scaling_consumers": [], "scaling_nodes": [], "modes_skipped": {},
           "small_modes": [], "prefetch": {}}
    lat_files = {}
    modes = ["TCP"]
    if "transfer" not in skip:
        print("[transfer] large files, DYAD vs raw TCP", flush=True)
        modes, res["modes_skipped"] = detect_modes(r, parse_modes(args.modes)
                                                   if args.modes else None)
        for mode, why in res["modes_skipped"].items():
            print("  skipped transport %s: %s" % (mode, why), flush=True)
        res["transfer"] = section_transfer(r, prof, args.quick, modes)
        res["link"] = next((t.get("link") for t in res["transfer"] if t.get("link")), None)
    res["modes"] = modes
    if "small" not in skip:
        print("[small] many small files, DYAD vs polling a shared directory", flush=True)
        res["small"], lat_files = section_small(r, prof)
        res["small_modes"] = section_small_modes(r, prof, modes, res["small"])
    if "prefetch" not in skip:
        print("[prefetch] prefetch on publication and DataLoader look-ahead", flush=True)
        res["prefetch"] = section_prefetch(r, prof)
    if "metadata" not in skip:
        print("[metadata] publish/locate latency per store", flush=True)
        res["metadata"] = section_metadata(r, prof)
    if "preload" not in skip:
        print("[preload] interception overhead", flush=True)
        res["preload"] = section_preload(r, prof)
    if "scaling" not in skip:
        print("[scaling] consumers and nodes", flush=True)
        res["scaling_consumers"], res["scaling_nodes"] = section_scaling(r, prof)
    if "scale" not in skip:
        print("[scale] 2 to 64 emulated nodes, DYAD vs raw TCP", flush=True)
        res["scale"] = scale_section.run(r, args.quick)
    if "metadata-scale" not in skip and metadata_section.available(build):
        print("[metadata-scale] store ops/s from 64 services, waits at scale, idle "
              "connections", flush=True)
        res["metadata_scale"] = metadata_section.run(r, args.quick)

    res["failures"] = r.failures
    res["elapsed_s"] = time.monotonic() - t0
    figs = {}
    try:
        figs = plot_all(out, res["transfer"], res["small"], lat_files,
                        res["scaling_consumers"], res["scaling_nodes"], res["failures"])
    except Exception as e:  # a missing figure must not lose the numbers
        print("run_bench: plotting failed: %s" % e, file=sys.stderr)
        res["failures"].append("plots: %s" % e)
    try:
        figs.update(scale_section.plot(out, res.get("scale")))
    except Exception as e:
        print("run_bench: scale plot failed: %s" % e, file=sys.stderr)
        res["failures"].append("scale plot: %s" % e)
    res["elapsed_s"] = time.monotonic() - t0
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    write_report(out, res, figs)
    print("run_bench: done in %.0f s; report: %s" % (res["elapsed_s"],
                                                    os.path.join(out, "report.md")), flush=True)
    if r.failures:
        print("run_bench: %d measurement(s) failed: %s" % (len(r.failures),
                                                          "; ".join(r.failures)), flush=True)
    return 1 if r.failures else 0


if __name__ == "__main__":
    sys.exit(main())
