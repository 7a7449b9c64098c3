#!/usr/bin/env python3
"""Checks conf/grafana/tessera-dashboard.json (ctest monitoring.dashboard).

    check_dashboard.py PROMTOOL DASHBOARD.json RULES.yml

- the file is JSON, every panel id is unique, every panel and query uses the data source
  variable ${DS_PROMETHEUS} (defined in templating), and every $variable an expression uses is
  defined (or one of Grafana's $__ ones);
- every PromQL expression parses: each is written into a temporary rules file as a recording
  rule (Grafana's $__rate_interval and the like become 5m, other variables a plain string) and
  `promtool check rules` parses them all;
- every metric an expression names is one of the metrics spec's (issue 30: the server's and
  the job package's names below), or a series the rules file records; the rules file's own
  expressions are held to the same names;
- a panel whose description says "The threshold line is TesseraX's" draws its first threshold
  step at a value that alert compares against, so the dashboard follows a changed threshold.

Exits 0 when all holds; otherwise prints each problem and exits 1. A missing promtool is a
failure, not a skip.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

# The metric names of the spec (issue 30). A histogram stands for its _bucket, _sum, _count.
SPEC_METRICS = {
    # tesserad
    "tessera_build_info", "tessera_up_seconds", "tessera_map_epoch", "tessera_requests_total",
    "tessera_request_errors_total", "tessera_received_bytes_total", "tessera_sent_bytes_total",
    "tessera_request_duration_seconds", "tessera_protocol_errors_total", "tessera_connections",
    "tessera_connections_accepted_total", "tessera_connections_refused_total",
    "tessera_dataset_read_bytes_total", "tessera_dataset_reads_total",
    "tessera_dataset_written_bytes_total", "tessera_hot_window_seconds",
    "tessera_hot_pg_read_bytes_per_second", "tessera_pg_read_bytes_per_second_median",
    "tessera_hot_shard_read_bytes_per_second", "tessera_replica_lag_operations",
    "tessera_replica_lag_bytes", "tessera_replica_lag_seconds", "tessera_replicas_recovering",
    "tessera_pgs", "tessera_pgs_not_confirmed", "tessera_backfills_total",
    "tessera_repairs_total", "tessera_checksum_failures_total",
    "tessera_wal_damage_timestamp_seconds", "tessera_disk_used_bytes", "tessera_disk_free_bytes",
    "tessera_disk_reserve_bytes", "tessera_cache_hits_total", "tessera_cache_misses_total",
    "tessera_cache_evictions_total", "tessera_cache_bytes", "tessera_cache_budget_bytes",
    "tessera_peer_sent_bytes_total", "tessera_peer_received_bytes_total",
    "tessera_process_resident_memory_bytes",
    # the Python package (tessera.metrics)
    "tessera_job_data_stall_seconds_total", "tessera_job_stalls_total",
    "tessera_job_retries_total", "tessera_job_read_bytes_total", "tessera_job_units_total",
    "tessera_job_bytes_ahead", "tessera_job_steps_total", "tessera_job_step_seconds",
    "tessera_job_step_stall_seconds",
}
# Families the spec leaves open; tessera_ec_repair_: the EC repair's (issue 33).
SPEC_PREFIXES = ("tessera_scrub_", "tessera_rocksdb_", "tessera_ec_repair_")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
OTHER_METRICS = {"up"}  # Prometheus' own
# Words PromQL may show outside strings that are not metric names.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "inf", "nan",
}

GRAFANA_DURATION_VARS = ("$__rate_interval", "$__interval", "$__range", "${__rate_interval}",
                         "${__interval}", "${__range}")
VAR_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
NAME_RE = re.compile(r"(?<![\w:.])([a-zA-Z_:][\w:]*)\s*(\(|\{|\[|)")


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def substitute(expr):
    for v in GRAFANA_DURATION_VARS:
        expr = expr.replace(v, "5m")
    return VAR_RE.sub("grafana_var", expr)


def metric_names(expr):
    """Metric names in a PromQL expression (string literals, label matchers and function
    names left out)."""
    bare = STRING_RE.sub('""', expr)
    bare = re.sub(r"\{[^}]*\}", "{}", bare)        # label matchers
    bare = re.sub(r"\[[^\]]*\]", "[]", bare)       # ranges
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", bare)
    names = set()
    for m in NAME_RE.finditer(bare):
        word, follow = m.group(1), m.group(2)
        if follow == "(" or word.lower() in PROMQL_WORDS:
            continue  # a function or an operator
        if re.fullmatch(r"\d.*", word):
            continue
        names.add(word)
    return names


def known(name, recorded):
    if name in recorded or name in SPEC_METRICS or name in OTHER_METRICS:
        return True
    if name.startswith(SPEC_PREFIXES):
        return True
    for s in HISTOGRAM_SUFFIXES:
        if name.endswith(s) and name[: -len(s)] in SPEC_METRICS:
            return True
    return False


def rules_exprs(path):
    """(record names, [(where, expr)], {alert: [expr]}) of a rules file, read without a YAML
    library: the rules file keeps each `record:` and `alert:` on one line and each `expr:`
    either on its line or as a block."""
    recorded, exprs, alerts = set(), [], {}
    alert = None
    lines = open(path, encoding="utf-8").read().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"\s*-?\s*record:\s*(\S+)", line)
        if m:
            recorded.add(m.group(1))
            alert = None
        m = re.match(r"\s*-?\s*alert:\s*(\S+)", line)
        if m:
            alert = m.group(1)
        m = re.match(r"(\s*)expr:\s*(.*)$", line)
        if m:
            indent, rest = len(m.group(1)), m.group(2).strip()
            if rest in (">-", ">", "|", "|-"):
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or
                                          len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i].strip())
                    i += 1
                exprs.append((f"{path}:{i}", " ".join(block)))
            else:
                exprs.append((f"{path}:{i + 1}", rest))
                i += 1
            if alert:
                alerts.setdefault(alert, []).append(exprs[-1][1])
            continue
        i += 1
    return recorded, exprs, alerts


def compared_constants(expr):
    """The numbers an expression compares against (`> 30`, `< 0.10`, `>= 2`)."""
    return {float(n) for n in re.findall(r"[<>]=?\s*([0-9][0-9.]*(?:e[+-]?[0-9]+)?)", expr)}


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    promtool, dash_path, rules_path = sys.argv[1:]
    problems = []
    if not (os.path.isfile(promtool) and os.access(promtool, os.X_OK)):
        print(f"check_dashboard: no promtool at '{promtool}': install Debian's prometheus "
              "package (scripts/deps)", file=sys.stderr)
        return 1
    try:
        dash = json.load(open(dash_path, encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"check_dashboard: {dash_path}: not valid JSON: {e}", file=sys.stderr)
        return 1

    templ = dash.get("templating", {}).get("list", [])
    variables = {v.get("name") for v in templ}
    ds_vars = [v for v in templ if v.get("name") == "DS_PROMETHEUS"]
    if not ds_vars or ds_vars[0].get("type") != "datasource" or ds_vars[0].get("query") != "prometheus":
        problems.append("templating has no datasource variable DS_PROMETHEUS of type prometheus")

    recorded, rexprs, alerts = rules_exprs(rules_path)
    exprs = []  # (where, expr)
    ids = {}
    for p in walk_panels(dash.get("panels", [])):
        title = p.get("title", "?")
        if p.get("id") in ids:
            problems.append(f"panel '{title}': id {p.get('id')} also used by '{ids[p['id']]}'")
        ids[p.get("id")] = title
        if p.get("type") == "row":
            continue
        if "gridPos" not in p:
            problems.append(f"panel '{title}': no gridPos")
        if not p.get("targets"):
            problems.append(f"panel '{title}': no queries")
        m = re.search(r"threshold line is (\w+)'s", p.get("description", ""))
        if m:
            steps = p.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
            values = [s["value"] for s in steps if s.get("value") is not None]
            consts = set()
            for e in alerts.get(m.group(1), []):
                consts |= compared_constants(e)
            if m.group(1) not in alerts:
                problems.append(f"panel '{title}': no alert {m.group(1)} in {rules_path}")
            elif not values or float(values[0]) not in consts:
                problems.append(f"panel '{title}': its threshold line {values[:1]} is not one of "
                                f"{m.group(1)}'s thresholds {sorted(consts)}")
        for obj, what in [(p, "panel")] + [(t, f"query {t.get('refId')}") for t in p.get("targets", [])]:
            if obj.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
                problems.append(f"panel '{title}' {what}: datasource is not ${{DS_PROMETHEUS}}")
        for t in p.get("targets", []):
            if not t.get("expr", "").strip():
                problems.append(f"panel '{title}' query {t.get('refId')}: empty expr")
                continue
            exprs.append((f"panel '{title}' query {t.get('refId')}", t["expr"]))
    for v in templ:
        if v.get("type") == "query":
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else q or ""
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q.strip())
            if not m:
                problems.append(f"variable {v.get('name')}: not label_values(SELECTOR, LABEL): {q}")
                continue
            exprs.append((f"variable {v.get('name')}", m.group(1)))

    for where, e in exprs:
        for m in VAR_RE.finditer(e):
            name = next(g for g in m.groups() if g)
            if not name.startswith("__") and name not in variables:
                problems.append(f"{where}: ${name} is not a dashboard variable")
    for where, e in exprs + rexprs:
        for name in sorted(metric_names(substitute(e))):
            if name != "grafana_var" and not known(name, recorded):
                problems.append(f"{where}: '{name}' is neither in the metrics spec nor recorded "
                                f"by {os.path.basename(rules_path)}")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dashboard-exprs.yml")
        with open(path, "w", encoding="utf-8") as f:
            f.write("groups:\n  - name: dashboard\n    rules:\n")
            for i, (where, e) in enumerate(exprs):
                f.write(f"      # {where}\n      - record: dashboard:expr_{i}:check\n"
                        f"        expr: {json.dumps(substitute(e))}\n")
        r = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True)
        if r.returncode != 0:
            out = (r.stdout + r.stderr).replace(path, "dashboard-exprs.yml")
            # promtool names the rule by its position: say which panel it came from
            for i, (where, e) in enumerate(exprs):
                out = out.replace(f"dashboard:expr_{i}:check", f"{where}: {e}")
            problems.append("promtool check rules does not parse every expression:\n" + out)

    for p in problems:
        print("check_dashboard: " + p, file=sys.stderr)
    if problems:
        return 1
    print(f"check_dashboard: {dash_path}: {len(ids)} panels, {len(exprs)} expressions parse, "
          f"every metric named is in the spec or recorded ({len(rexprs)} rule expressions too), "
          f"threshold lines match the alerts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
