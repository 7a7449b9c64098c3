#!/usr/bin/env python3
"""Turns the runs of bench/run into the results: medians per (test, system), the ratios
tessera/peer and tessera/iperf3 ceiling, the targets of issue 4, the plan reader beside local
files (issue 11), a CSV of every run and a PNG chart (gnuplot).

    bench/report.py --runs runs.jsonl --meta meta.txt --out DIR

Writes DIR/latest.md, DIR/runs.csv, DIR/latest.png (and the chart's data and script).
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys

TESTS = [
    ("get1m-c1", "1 MiB GET, 1 connection"),
    ("get1m-c16", "1 MiB GET, 16 connections"),
    ("get16k-c16", "16 KiB GET, 16 connections, 1 in flight each"),
    ("pipe16k-c1-d16", "16 KiB GET pipelined, 1 connection x 16 in flight"),
    ("pipe16k-c16-d16", "16 KiB GET pipelined, 16 connections x 16 in flight"),
]
SYSTEMS = [
    ("tessera", "tessera TCP"),
    ("nginx", "nginx HTTP (sendfile)"),
    ("redis", "Redis"),
    ("memcached", "memcached"),
    ("tessera-tls", "tessera TLS"),
    ("nginx-https", "nginx HTTPS"),
    ("redis-tls", "Redis TLS"),
    ("memcached-tls", "memcached TLS"),
]
SYS_NAME = dict(SYSTEMS)
# Plan-reader tests (bench/tsplanread.c): (test, record size, order); systems tessera, local.
PLAN_TESTS = [(f"plan-{sz.lower()}-{o}", label, oname)
              for sz, label in (("4K", "4 KiB"), ("100K", "100 KiB"), ("1M", "1 MiB"))
              for o, oname in (("seq", "sequential"), ("shuf", "shuffled (global)"))]
RSS_MARGIN_MB = 64
# A run during which other processes kept more than this much CPU busy (cores) is disturbed:
# the machine is shared. Medians use the undisturbed runs of a (test, system) when it has any.
OTHER_MAX = 0.25


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


def fmt(v, digits=2):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.{digits}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def fr(v):
    return "-" if v is None else f"{v:.2f}x"


def load_meta(path):
    meta = {}
    with open(path) as f:
        for line in f:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                meta[k] = v
    return meta


def target_rows(w, rows):
    """A table of (row, value, target, unit); a row named '(at most)' wants value <= target."""
    w("| row | this run | target | |")
    w("|---|---|---|---|")
    for name, v, target, unit in rows:
        at_most = "(at most)" in name
        ok = None if v is None else (v <= target if at_most else v >= target)
        shown = "-" if v is None else f"{v:.2f}"
        w(f"| {name} | {shown} | {'<=' if at_most else '>='} {target:.2f} {unit} "
          f"| {'' if ok is None else 'met' if ok else 'MISSED'} |")
    w("")


def targets_section(w, m, ceil1):
    """Issue 15's rows, each against its target, from this run's medians."""
    def best(test, systems):
        v = [x for x in (m(test, s, "ops_per_s") for s in systems) if x]
        return max(v) if v else None
    rows = [
        ("put, 1 conn, sync none", ratio(m("put", "tessera", "gb_per_s"), m("put", "nginx", "gb_per_s")),
         1.0, "x nginx WebDAV PUT"),
        ("put, sync none, GB/s", m("put", "tessera", "gb_per_s"), 1.5, "GB/s"),
        ("put, sync none, server CPU s/GB (at most)", m("put", "tessera", "server_cpu_s_per_gb"), 0.6,
         "s/GB"),
        ("put, sync seal", ratio(m("put-seal", "tessera", "gb_per_s"), m("put-seal", "dd", "gb_per_s")),
         0.8, "x dd conv=fdatasync"),
        ("put, 5-node cluster (core 3)", ratio(m("put", "cluster", "gb_per_s"), m("put", "tessera", "gb_per_s")),
         1 / 3, "x one node"),
        ("tessera ingest (TFRecord)", ratio(m("put", "ingest", "gb_per_s"), m("put", "tessera", "gb_per_s")),
         0.8, "x put"),
        ("GET 1 MiB, 1 conn", ratio(m("get1m-c1", "tessera", "gb_per_s"), m("get1m-c1", "nginx", "gb_per_s")),
         1.0, "x nginx sendfile"),
        ("GET 1 MiB, 1 conn", ratio(m("get1m-c1", "tessera", "gb_per_s"), ceil1), 0.9, "x iperf3"),
        ("GET 16 KiB, 16 conns", ratio(m("get16k-c16", "tessera", "ops_per_s"),
                                       best("get16k-c16", ("redis", "memcached"))),
         1.1, "x the better of Redis/memcached"),
        ("GET 16 KiB, 16 conns, p99 (at most)",
         ratio(m("get16k-c16", "tessera", "p99_us"),
               min([x for x in (m("get16k-c16", s, "p99_us") for s in ("redis", "memcached")) if x],
                   default=None)), 1.0, "x the better p99"),
        ("GET 1 MiB over TLS, 16 conns", ratio(m("get1m-c16", "tessera-tls", "gb_per_s"),
                                               m("get1m-c16", "nginx-https", "gb_per_s")),
         1.5, "x nginx HTTPS"),
    ]
    w("## Issue 15: every row against its target")
    w("")
    target_rows(w, rows)


def issue31_section(w, m):
    """Issue 31's rows against its targets (small writes from bench/small/run's records)."""
    def best_p99(test):
        v = [x for x in (m(test, s, "p99_us") for s in ("redis", "memcached")) if x]
        return min(v) if v else None
    one_node = m("put", "tessera", "server_cpu_s_per_gb")
    cluster = m("put", "cluster", "server_cpu_s_per_gb")
    rows = [
        ("small writes, 16 KiB x 16, sync none (inline)",
         ratio(m("small16k-c16", "ts-none", "ops_per_s"), m("small16k-c16", "redis", "ops_per_s")),
         0.5, "x Redis SET"),
        ("small writes, p99 µs (at most)", m("small16k-c16", "ts-none", "p99_us"), 2000, "µs"),
        ("small durable writes, sync seal, writes/s", m("small16k-c16", "ts-seal", "ops_per_s"), 5000,
         "writes/s"),
        ("small durable writes, sync seal",
         ratio(m("small16k-c16", "ts-seal", "ops_per_s"), m("small16k-c16", "redis-aof", "ops_per_s")),
         1.0, "x Redis appendfsync always (reported)"),
        ("replicated put, CPU per stored copy (at most)",
         ratio(cluster / 3 if cluster else None, one_node), 2.0, "x one node's put CPU per GB"),
        ("TLS GET 1 MiB, 16 conns", ratio(m("get1m-c16", "tessera-tls", "gb_per_s"),
                                          m("get1m-c16", "nginx-https", "gb_per_s")), 1.5,
         "x nginx HTTPS"),
        ("GET 16 KiB x 16", ratio(m("get16k-c16", "tessera", "ops_per_s"),
                                  max([x for x in (m("get16k-c16", s, "ops_per_s")
                                                   for s in ("redis", "memcached")) if x],
                                      default=None)), 1.1, "x the better of Redis/memcached"),
        ("GET 16 KiB x 16, p99 (at most)", ratio(m("get16k-c16", "tessera", "p99_us"),
                                                 best_p99("get16k-c16")), 1.0, "x the better p99"),
        ("GET 16 KiB pipelined 16 x 16, p99 (at most)",
         ratio(m("pipe16k-c16-d16", "tessera", "p99_us"), m("pipe16k-c16-d16", "redis", "p99_us")),
         2.0, "x Redis's p99"),
        ("GET 1 MiB x 16, server CPU s/GB (at most)", m("get1m-c16", "tessera", "server_cpu_s_per_gb"),
         0.12, "s/GB"),
    ]
    w("## Issue 31: every row against its target")
    w("")
    target_rows(w, rows)
    w("Misses are explained by profile in docs/benchmarks.md (issue 31).")
    w("")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--meta", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    global OTHER_MAX
    os.makedirs(a.out, exist_ok=True)
    meta = load_meta(a.meta)
    OTHER_MAX = float(meta.get("other_max", OTHER_MAX))
    runs = []
    with open(a.runs) as f:
        for line in f:
            line = line.strip()
            if line:
                runs.append(json.loads(line))

    # raw runs as CSV
    keys = []
    for r in runs:
        for k in r:
            if k not in keys:
                keys.append(k)
    with open(os.path.join(a.out, "runs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in runs:
            w.writerow(r)

    allruns = {}
    for r in runs:
        allruns.setdefault((r["test"], r["system"]), []).append(r)
    groups = {}
    for key, rs in allruns.items():
        clean = [r for r in rs if r.get("other_cpu", 0) <= OTHER_MAX]
        groups[key] = clean or rs

    def m(test, system, field):
        return med([r.get(field) for r in groups.get((test, system), [])])

    def n(test, system):
        rs = allruns.get((test, system), [])
        clean = [r for r in rs if r.get("other_cpu", 0) <= OTHER_MAX]
        return f"{len(clean)}/{len(rs)}" + ("" if clean else " (all disturbed)")

    ceil1 = m("ceiling", "iperf3-1", "gb_per_s")
    ceil2 = m("ceiling", "iperf3-2", "gb_per_s")
    ceil_best = max([c for c in (ceil1, ceil2) if c is not None], default=None)

    out = []
    w = out.append
    w(f"# tessera side-by-side benchmark ({meta.get('date', '?')})")
    w("")
    w(f"`{meta.get('command', 'bench/run')}`: {meta.get('rounds')} round(s), "
      f"{meta.get('duration_s')} s measured after {meta.get('warmup_s')} s warm-up per run; "
      "medians over the rounds. Servers on core "
      f"{meta.get('server_cpu')}, load generator on core {meta.get('load_cpu')}; 127.0.0.1 only.")
    w("")
    w("| machine | |")
    w("|---|---|")
    for k, label in [("cpu", "CPU"), ("lscpu", "lscpu"), ("nproc", "nproc"),
                     ("memory", "memory"), ("kernel", "kernel"), ("tessera", "tessera (git)"),
                     ("nginx", "nginx"), ("redis", "Redis"), ("memcached", "memcached"),
                     ("iperf3", "iperf3"), ("openssl", "OpenSSL"), ("compiler", "compiler")]:
        w(f"| {label} | {meta.get(k, '?')} |")
    w("")

    w("## Ceiling: iperf3 over loopback (server sends, -R)")
    w("")
    w("| streams | GB/s | runs (undisturbed/all) |")
    w("|---|---|---|")
    w(f"| 1 | {fmt(ceil1)} | {n('ceiling', 'iperf3-1')} |")
    w(f"| 2 | {fmt(ceil2)} | {n('ceiling', 'iperf3-2')} |")
    w("")

    w("## Reads")
    w("")
    w("GB/s and ops/s are medians; p50/p99 are the medians of each run's percentiles (µs, per "
      "request, send to last byte). *server CPU* is the server's CPU time over the window "
      "(1.00 = one core busy), *s/GB* its CPU seconds per GB served, *client CPU* the load "
      "generator's, *other CPU* what else ran on the machine meanwhile (cores; the machine is "
      f"shared). *runs* counts the undisturbed runs (other CPU ≤ {OTHER_MAX} cores) of all; "
      "the medians are over the undisturbed ones when there are any. *tessera ÷ this* compares tessera over the same transport (TCP with TCP, "
      "TLS with TLS) with the row's system; on tessera's rows *÷ iperf3* is the share of the "
      "loopback ceiling (1 stream for 1 connection, the better of 1 and 2 streams otherwise).")
    w("")
    w("| test | system | GB/s | ops/s | p50 µs | p99 µs | server CPU | s/GB | client CPU "
      "| other CPU | tessera ÷ this | ÷ iperf3 | runs |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for test, desc in TESTS:
        for sysid, sysname in SYSTEMS:
            if not groups.get((test, sysid)):
                continue
            tls = sysid.endswith("-tls") or sysid == "nginx-https"
            ts_sys = "tessera-tls" if tls else "tessera"
            ops = m(test, sysid, "ops_per_s")
            if sysid.startswith("tessera"):
                vs = "-"
                ceil = ceil1 if test == "get1m-c1" else ceil_best
                vc = fr(ratio(m(test, sysid, "gb_per_s"), ceil)) if "1m" in test else "-"
            else:
                vs = fr(ratio(m(test, ts_sys, "ops_per_s"), ops))
                vc = "-"
            w(f"| {desc} | {sysname} | {fmt(m(test, sysid, 'gb_per_s'))} | {fmt(ops)} "
              f"| {fmt(m(test, sysid, 'p50_us'), 1)} | {fmt(m(test, sysid, 'p99_us'), 1)} "
              f"| {fmt(m(test, sysid, 'server_cpu_util'))} "
              f"| {fmt(m(test, sysid, 'server_cpu_s_per_gb'), 3)} "
              f"| {fmt(m(test, sysid, 'client_cpu'))} | {fmt(m(test, sysid, 'other_cpu'))} | {vs} | {vc} | {n(test, sysid)} |")
    w("")

    # writes (bench/put/run; its runs carry no other-CPU figure)
    w("## Writes: sealed-shard uploads, one connection")
    w("")
    w(f"{meta.get('put_count')} x {meta.get('put_size')} in 1 MiB pieces (bench/put/run, systems "
      "alternating run by run, each in a fresh daemon after warming the page cache): tessera "
      "sealed shards into one node, nginx WebDAV PUTs of each piece, dd of the same bytes to a "
      "file, `tessera ingest` of TFRecord files of the same size (100 KiB records), a 5-node "
      "cluster (core 3, min_core 2, TLS between the nodes; CPU of all five daemons); then "
      "`sync = seal` beside dd `conv=fdatasync`.")
    w("")
    w("| sync | system | GB/s | server CPU s/GB | vs | ratio | runs |")
    w("|---|---|---|---|---|---|---|")
    for test, sync, rows in (("put", "none", (("tessera", None), ("nginx", "tessera / nginx"),
                                              ("dd", "tessera / dd"),
                                              ("ingest", "ingest / tessera"),
                                              ("cluster", "cluster / tessera"))),
                             ("put-seal", "seal", (("tessera", None), ("dd", "tessera / dd")))):
        ts = m(test, "tessera", "gb_per_s")
        for sysid, label in rows:
            if not groups.get((test, sysid)):
                continue
            g = m(test, sysid, "gb_per_s")
            if label and label.startswith("tessera"):
                r = ratio(ts, g)
            else:
                r = ratio(g, ts) if label else None
            w(f"| {sync} | {sysid} | {fmt(g)} | {fmt(m(test, sysid, 'server_cpu_s_per_gb'), 3)} "
              f"| {label or ''} | {fr(r) if label else ''} | {len(allruns.get((test, sysid), []))} |")
    w("")
    w("## Small writes: 16 KiB, 16 connections, one in flight each")
    w("")
    w("tessera (default settings: a chunk file per shard): each write a sealed shard of 16 KiB "
      "(`tessera_put`: SHARD_WRITE and SHARD_SEAL in one round trip); Redis `SET` and memcached "
      "`set` of 16 KiB values (tsload write). Inline shards and `sync = seal`: bench/small/run, "
      "in the issue 31 table below.")
    w("")
    w("| system | ops/s | p50 µs | p99 µs | server CPU | client CPU | tessera ÷ this | runs |")
    w("|---|---|---|---|---|---|---|---|")
    for sysid in ("tessera", "redis", "memcached"):
        if not groups.get(("put16k-c16", sysid)):
            continue
        ops = m("put16k-c16", sysid, "ops_per_s")
        vs = "-" if sysid == "tessera" else fr(ratio(m("put16k-c16", "tessera", "ops_per_s"), ops))
        w(f"| {sysid} | {fmt(ops)} | {fmt(m('put16k-c16', sysid, 'p50_us'), 1)} "
          f"| {fmt(m('put16k-c16', sysid, 'p99_us'), 1)} | {fmt(m('put16k-c16', sysid, 'server_cpu_util'))} "
          f"| {fmt(m('put16k-c16', sysid, 'client_cpu'))} | {vs} | {n('put16k-c16', sysid)} |")
    w("")
    targets_section(w, m, ceil1)
    issue31_section(w, m)

    plan_section(w, m, n, meta, groups)

    # resources
    block = int(meta.get("ts_block_cache_mb", 256))
    cache = int(meta.get("ts_cache_mb", 0))
    outkb = int(meta.get("ts_conn_output_kb", 4096))
    chunk_kb = int(meta.get("ts_chunk_kb", 1024))
    budget = block + cache + 16 * (outkb + 2 * chunk_kb) / 1024

    def peak_mb(sysid, field):
        v = [r[field] for r in allruns.get(("get1m-c16", sysid), []) if r.get(field) is not None]
        return max(v) / 1024 if v else None

    # resident memory plus memfd bytes that are not mapped (a mapped memfd is in RSS already)
    def held_mb(r):
        if r.get("server_hwm_kb") is None:
            return None
        unmapped = max(0, (r.get("server_memfd_kb") or 0) - (r.get("server_shmem_kb") or 0))
        return (r["server_hwm_kb"] + unmapped) / 1024

    held = [held_mb(r) for s_ in ("tessera", "tessera-tls") for r in allruns.get(("get1m-c16", s_), [])]
    held = [h for h in held if h is not None]
    peak = max(held) if held else None
    w("## tesserad resources, 16 connections reading 1 MiB")
    w("")
    w("| | TCP | TLS |")
    w("|---|---|---|")
    w(f"| CPU seconds per GB served | {fmt(m('get1m-c16', 'tessera', 'server_cpu_s_per_gb'), 3)} "
      f"| {fmt(m('get1m-c16', 'tessera-tls', 'server_cpu_s_per_gb'), 3)} |")
    w(f"| CPU busy (cores) | {fmt(m('get1m-c16', 'tessera', 'server_cpu_util'))} "
      f"| {fmt(m('get1m-c16', 'tessera-tls', 'server_cpu_util'))} |")
    w(f"| peak RSS (VmHWM since the test began, MiB, max over runs) "
      f"| {fmt(peak_mb('tessera', 'server_hwm_kb'))} | {fmt(peak_mb('tessera-tls', 'server_hwm_kb'))} |")
    w(f"| memfd files at the end (MiB) "
      f"| {fmt(peak_mb('tessera', 'server_memfd_kb'))} | {fmt(peak_mb('tessera-tls', 'server_memfd_kb'))} |")
    w(f"| of which mapped (RssShmem, in the RSS above; MiB) "
      f"| {fmt(peak_mb('tessera', 'server_shmem_kb'))} | {fmt(peak_mb('tessera-tls', 'server_shmem_kb'))} |")
    w("")
    w(f"Memory budget: RocksDB block cache {block} MiB + chunk cache {cache} MiB + 16 connections "
      f"x (output budget {outkb // 1024} MiB + 2 pinned chunks of {chunk_kb // 1024} MiB) = "
      f"{budget:.0f} MiB, plus a margin of {RSS_MARGIN_MB} MiB for code, RocksDB memtables and "
      f"tables, and the allocator = {budget + RSS_MARGIN_MB:.0f} MiB. Compared with it: peak RSS "
      "plus the memfd bytes that are not mapped (those are not in RSS).")
    w("")

    # targets
    w("## Targets (issue 4)")
    w("")
    w("| target | measured | goal | met |")
    w("|---|---|---|---|")

    def target(desc, val, goal, better="higher", unit="x"):
        if val is None:
            w(f"| {desc} | - | {goal}{unit} | not measured |")
            return
        ok = val >= goal if better == "higher" else val <= goal
        if unit == "x":
            miss = "" if ok else f" (reaches {val / goal:.0%} of the goal)"
            w(f"| {desc} | {val:.2f}x | ≥ {goal:.2f}x | {'yes' if ok else 'NO' + miss} |")
        else:
            w(f"| {desc} | {val:.0f}{unit} | ≤ {goal:.0f}{unit} | {'yes' if ok else 'NO'} |")

    for c in ("c1", "c16"):
        target(f"1 MiB GET over TCP, {c[1:]} conn: tessera ÷ nginx sendfile",
               ratio(m(f"get1m-{c}", "tessera", "gb_per_s"), m(f"get1m-{c}", "nginx", "gb_per_s")),
               1.0)
    target("1 MiB GET over TCP, 1 conn: tessera ÷ iperf3 1 stream",
           ratio(m("get1m-c1", "tessera", "gb_per_s"), ceil1), 0.9)
    target("1 MiB GET over TCP, 16 conns: tessera ÷ iperf3 best",
           ratio(m("get1m-c16", "tessera", "gb_per_s"), ceil_best), 0.9)
    for c in ("c1", "c16"):
        target(f"1 MiB GET over TLS (AES-128-GCM), {c[1:]} conn: tessera ÷ nginx HTTPS",
               ratio(m(f"get1m-{c}", "tessera-tls", "gb_per_s"),
                     m(f"get1m-{c}", "nginx-https", "gb_per_s")), 1.5)
    best = max([v for v in (m("get16k-c16", "redis", "ops_per_s"),
                            m("get16k-c16", "memcached", "ops_per_s")) if v is not None],
               default=None)
    target("16 KiB GET, 16 conns x 1: tessera ÷ best of Redis, memcached",
           ratio(m("get16k-c16", "tessera", "ops_per_s"), best), 1.1)
    p99s = [v for v in (m("get16k-c16", "redis", "p99_us"), m("get16k-c16", "memcached", "p99_us"))
            if v is not None]
    target("16 KiB GET, 16 conns x 1: tessera p99 ≤ the better p99 of Redis, memcached",
           m("get16k-c16", "tessera", "p99_us"), min(p99s) if p99s else 0, better="lower",
           unit=" µs")
    target("tesserad memory (peak RSS + unmapped memfd), 16 x 1 MiB readers ≤ budget + margin", peak,
           budget + RSS_MARGIN_MB, better="lower", unit=" MiB")
    w("")
    w("Raw runs: runs.jsonl / runs.csv beside this file; chart: latest.png.")
    w("")

    md = "\n".join(out)
    with open(os.path.join(a.out, "latest.md"), "w") as f:
        f.write(md)

    chart(a.out, m, ceil1, ceil2, meta)
    return 0


def plan_section(w, m, n, meta, groups):
    if not any(groups.get((t, "tessera")) or groups.get((t, "local")) for t, _, _ in PLAN_TESTS):
        return
    opts = next((r for t, _, _ in PLAN_TESTS for r in groups.get((t, "tessera"), [])), {})
    w("## Plan reader beside local files (issue 11)")
    w("")
    w(f"Rank 0 of 1 reads its whole plan over {meta.get('plan_total', '?')} of fixed-size "
      f"records per size ({meta.get('plan_shards', '?')} shards with record indexes) as record "
      "units, in order "
      "(shuffle none) or shuffled (global), with libtessera's reader (default options: "
      f"{opts.get('connections', '?')} connections x depth {opts.get('depth', '?')}, window "
      f"{opts.get('window_units', '?')} units / {(opts.get('window_bytes') or 0) >> 20} MiB), "
      "on the load core, every byte touched; *local* reads the same records in the same order "
      "(the same tessera_plan) with pread from shard files in the page cache, one thread. Whole "
      "epochs until the run's duration passed, after one unmeasured epoch that warms the caches "
      "and checks the bytes and the order. *stall* is the share of the time the caller waited "
      "for data (in tessera_reader_next; local: in pread), *µs/rec* that wait per record. "
      "*tesserad CPU* and *client CPU* in cores. *ratio* is tessera ÷ local (records/s). "
      "*one READ each*: the same reader with READV turned off (`TESSERA_READER_READV=0`, 4 KiB "
      "only), and *READV gain* tessera ÷ that.")
    w("")
    w("| records | order | tessera rec/s | tessera GB/s | stall | µs/rec | tesserad CPU "
      "| client CPU | local rec/s | local GB/s | local stall | ratio | one READ each rec/s "
      "| READV gain | runs (tessera, local) |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")

    def pct(v):
        return "-" if v is None else f"{v * 100:.0f}%"

    def per_rec(test, sysid):
        return med([r["stall_ns"] / r["records"] / 1e3 for r in groups.get((test, sysid), [])
                    if r.get("records")])

    for test, size, order in PLAN_TESTS:
        if not (groups.get((test, "tessera")) or groups.get((test, "local"))):
            continue
        ts, lo = m(test, "tessera", "records_per_s"), m(test, "local", "records_per_s")
        one = m(test, "tessera-read", "records_per_s")
        w(f"| {size} | {order} | {fmt(ts)} | {fmt(m(test, 'tessera', 'gb_per_s'), 3)} "
          f"| {pct(m(test, 'tessera', 'stall_frac'))} | {fmt(per_rec(test, 'tessera'))} "
          f"| {fmt(m(test, 'tessera', 'server_cpu_util'))} "
          f"| {fmt(m(test, 'tessera', 'client_cpu'))} | {fmt(lo)} "
          f"| {fmt(m(test, 'local', 'gb_per_s'), 3)} | {pct(m(test, 'local', 'stall_frac'))} "
          f"| {fr(ratio(ts, lo))} | {fmt(one)} | {fr(ratio(ts, one))} "
          f"| {n(test, 'tessera')}, {n(test, 'local')} |")
    w("")


def chart(outdir, m, ceil1, ceil2, meta):
    def val(v, scale=1.0):
        return "-" if v is None else f"{v * scale:.4f}"

    present = [s for s, _ in SYSTEMS if any(m(t, s, "ops_per_s") is not None for t, _ in TESTS)]
    with open(os.path.join(outdir, "chart-1m.dat"), "w") as f:
        for s in present:
            f.write(f"{s} {val(m('get1m-c1', s, 'gb_per_s'))} {val(m('get1m-c16', s, 'gb_per_s'))}\n")
    with open(os.path.join(outdir, "chart-16k.dat"), "w") as f:
        for s in present:
            f.write(f"{s} {val(m('get16k-c16', s, 'ops_per_s'), 1e-3)}\n")
    with open(os.path.join(outdir, "chart-pipe.dat"), "w") as f:
        for s in present:
            a, b = m("pipe16k-c1-d16", s, "ops_per_s"), m("pipe16k-c16-d16", s, "ops_per_s")
            if a is not None or b is not None:
                f.write(f"{s} {val(a, 1e-3)} {val(b, 1e-3)}\n")
    with open(os.path.join(outdir, "chart-lat.dat"), "w") as f:
        for s in present:
            if m("get16k-c16", s, "p50_us") is not None:
                f.write(f"{s} {val(m('get16k-c16', s, 'p50_us'))} {val(m('get16k-c16', s, 'p99_us'))}\n")
    c1 = ceil1 if ceil1 is not None else 0
    c2 = ceil2 if ceil2 is not None else 0
    gp = f"""
set terminal pngcairo size 1600,1000 font "DejaVu Sans,10"
set output "{outdir}/latest.png"
set datafile missing "-"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics
set key top left opaque box
set xtics rotate by -30 noenhanced
set multiplot layout 2,2 title "tessera vs peers, {meta.get('date', '')} ({meta.get('cpu', '')}, {meta.get('nproc', '')} cores; server core 0, load core 1)" noenhanced
set title "1 MiB GET throughput (GB/s); dashed: iperf3 loopback"
set ylabel "GB/s"
set yrange [0:*]
set offsets 0, 0, graph 0.3, 0
plot "{outdir}/chart-1m.dat" using 2:xtic(1) title "1 connection", \\
     "" using 3 title "16 connections", \\
     {c1} with lines dt 2 lw 2 lc rgb "black" title "iperf3 1 stream", \\
     {c2} with lines dt 3 lw 2 lc rgb "red" title "iperf3 2 streams"
set offsets 0, 0, graph 0.12, 0
set title "16 KiB GET, 16 connections x 1 in flight (k ops/s)"
set ylabel "k ops/s"
plot "{outdir}/chart-16k.dat" using 2:xtic(1) title "16 x 1" lc rgb "#4477aa"
set title "16 KiB GET pipelined, 16 in flight per connection (k ops/s)"
plot "{outdir}/chart-pipe.dat" using 2:xtic(1) title "1 conn x 16", "" using 3 title "16 conns x 16"
set title "16 KiB GET, 16 connections x 1: latency (µs)"
set ylabel "µs"
set logscale y
set yrange [*:*]
set offsets 0, 0, 0, 0
plot "{outdir}/chart-lat.dat" using 2:xtic(1) title "p50", "" using 3 title "p99"
unset multiplot
"""
    path = os.path.join(outdir, "chart.gp")
    with open(path, "w") as f:
        f.write(gp)
    r = subprocess.run(["gnuplot", path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit("gnuplot failed")


if __name__ == "__main__":
    sys.exit(main())
