"""The markdown report of bench/loader/run: medians per (data set, step, system), and tessera's
ratios against the targets of issue 12.

    report.py --runs runs.jsonl --meta meta.json
"""

import argparse
import json
import statistics
from collections import defaultdict

ORDER = ["tessera", "tessera-5", "wds-http", "streaming", "local-wds", "local-raw"]
NAMES = {
    "tessera": "tessera, 1 node",
    "tessera-5": "tessera, 5-node cluster",
    "wds-http": "WebDataset, HTTP from nginx",
    "streaming": "MosaicML Streaming (local dir as remote)",
    "local-wds": "local tar files, WebDataset",
    "local-raw": "local tar files, minimal reader",
}
STALL_MAX = 0.05


def med(runs, key):
    return statistics.median(r[key] for r in runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--meta", required=True)
    a = ap.parse_args()
    meta = json.load(open(a.meta))
    runs = [json.loads(line) for line in open(a.runs) if line.strip()]
    by = defaultdict(list)
    for r in runs:
        by[(r["dataset"], r["step_ms"], r["system"])].append(r)
    sets = sorted({r["dataset"] for r in runs}, key=lambda d: -max(
        r["sample_size"] for r in runs if r["dataset"] == d))
    loaded = sum(r.get("loaded", 0) for r in runs)
    size = {"-1": "smoke", "0": "quick", "1": "full"}[str(meta["full"])]

    out = [f"PyTorch DataLoader benchmark ({size}), {meta['date']}, `{meta['command']}`",
           "",
           f"{meta['cpu']}, {meta['nproc']} cores, {meta['memory']}, Linux {meta['kernel']}; "
           f"tessera {meta['tessera']}, nginx {meta['nginx']}, Python {meta['python']}, "
           f"{meta['versions']}. DataLoader: 2 workers, batch 64; step: {meta['step_kind']}; "
           f"{meta['rounds']} round(s), medians; servers on core 0, the loader on core 1. "
           f"Runs started or ended while another benchmark ran: {loaded} of {len(runs)}.",
           ""]
    for d in sets:
        ds_runs = [r for r in runs if r["dataset"] == d]
        ss = ds_runs[0]["sample_size"]
        n = ds_runs[0]["samples"]
        out += [f"#### {d}: {n} samples of {ss // 1024} KiB "
                f"({n * ss / 2**20:.0f} MiB per epoch)", "",
                "| step | system | samples/s | GB/s | data stall | first batch | "
                "loader CPU | every sample once | runs |",
                "|---:|---|---:|---:|---:|---:|---:|---|---:|"]
        steps = sorted({r["step_ms"] for r in ds_runs})
        for st in steps:
            for sysname in ORDER:
                rs = by.get((d, st, sysname))
                if not rs:
                    continue
                sps = [r["samples_per_s"] for r in rs]
                spread = f" ({min(sps):.0f}–{max(sps):.0f})" if len(rs) > 1 else ""
                ok = all(r["missing"] == 0 and r["dups"] == 0 and r["crc_bad"] == 0
                         for r in rs)
                out.append(
                    f"| {st:g} ms | {NAMES[sysname]} | {med(rs, 'samples_per_s'):.0f}{spread} "
                    f"| {med(rs, 'gb_per_s'):.3f} | {100 * med(rs, 'stall'):.1f} % "
                    f"| {med(rs, 'first_batch_s'):.2f} s | {med(rs, 'loader_cpu_s'):.2f} s "
                    f"| {'yes' if ok else 'NO'} | {len(rs)} |")
        out += ["", f"Targets, {d}: tessera's median samples/s over the other system's (judged "
                "at step 0), and its data stall (judged where the local files' is below 5 %):",
                "",
                "| step | system | vs WebDataset+nginx (>= 1.3) | vs Streaming (>= 1.0) | "
                "vs local files, best (>= 0.9) | data stall (< 5 % where local is) |",
                "|---:|---|---:|---:|---:|---:|"]
        for st in steps:
            def sps(s):
                rs = by.get((d, st, s))
                return med(rs, "samples_per_s") if rs else None
            local = [x for x in (sps("local-wds"), sps("local-raw")) if x]
            local_stall = min((med(by[(d, st, s)], "stall") for s in ("local-wds", "local-raw")
                               if by.get((d, st, s))), default=None)
            for t in ("tessera", "tessera-5"):
                mine = sps(t)
                if mine is None:
                    continue

                def ratio(other, goal):
                    # samples/s targets are judged at step 0 (throughput); with a step the
                    # loop may be bound by the step, and the ratio is shown as it is
                    if not other:
                        return "-"
                    v = mine / other
                    if st != 0:
                        return f"{v:.2f}"
                    return f"{v:.2f} {'met' if v >= goal else 'MISSED'}"
                stall = med(by[(d, st, t)], "stall")
                if local_stall is not None and local_stall < STALL_MAX:
                    sv = f"{100 * stall:.1f} % {'met' if stall < STALL_MAX else 'MISSED'}"
                else:
                    sv = f"{100 * stall:.1f} % (local {100 * local_stall:.1f} %: n/a)"
                out.append(f"| {st:g} ms | {NAMES[t]} | {ratio(sps('wds-http'), 1.3)} | "
                           f"{ratio(sps('streaming'), 1.0)} | "
                           f"{ratio(max(local) if local else None, 0.9)} | {sv} |")
        out.append("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
