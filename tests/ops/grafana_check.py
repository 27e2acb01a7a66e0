#!/usr/bin/env python3
"""Checks deploy/grafana/spdld.json the way Grafana would load it: a dashboard object with title,
uid, schemaVersion, templating and panels; every panel with a unique id, a known type, a gridPos
inside the 24-column grid, a Prometheus data source and targets with refId and expr; every metric an
expression names is one spdld exports (read from daemon/ops/metrics.cc and the job statistics table
proto/job_stats_fields.cc it is generated from); with promtool installed, every expression parses as
PromQL (promtool check rules on recording rules made of them); a panel shows the poisoned-GPU gauge.

Usage: grafana_check.py DASHBOARD_JSON METRICS_SOURCE... Exit 0 when all hold, 1 otherwise.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

dash_path, metric_sources = sys.argv[1], sys.argv[2:]
problems = []


def problem(msg):
    print("FAIL:", msg)
    problems.append(msg)


with open(dash_path) as f:
    dash = json.load(f)  # a JSON error fails here, with its line

for key, typ in (("title", str), ("uid", str), ("schemaVersion", int), ("panels", list), ("templating", dict)):
    if not isinstance(dash.get(key), typ):
        problem(f"dashboard.{key} missing or not a {typ.__name__}")

# The exported families: the names in metrics.cc's tables and Add calls, and the rows of the job
# statistics table (name, metric, type, ...).
src = ""
for path in metric_sources:
    with open(path) as f:
        src += f.read()
exported = set(re.findall(r'"(spdld_[a-z0-9_]+)"', src))
histograms = set(re.findall(r'AddHistogram\("(spdld_[a-z0-9_]+)"', src))
histograms |= set(re.findall(r'"(spdld_[a-z0-9_]+)",\s*"histogram"', src))
if not exported or not histograms:
    problem(f"no metric names found in {' '.join(metric_sources)}")


def known(name):
    if name in exported:
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in histograms:
            return True
    return False


PANEL_TYPES = {"timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "text", "row"}
ids = set()
exprs = []
for i, p in enumerate(dash.get("panels", [])):
    where = f"panel {i} ({p.get('title')!r})"
    if not isinstance(p.get("id"), int) or p["id"] in ids:
        problem(f"{where}: id missing or not unique")
    ids.add(p.get("id"))
    if p.get("type") not in PANEL_TYPES:
        problem(f"{where}: unknown type {p.get('type')!r}")
    if not p.get("title"):
        problem(f"{where}: no title")
    g = p.get("gridPos", {})
    if not all(isinstance(g.get(k), int) for k in ("x", "y", "w", "h")) or g["x"] + g["w"] > 24 or g["w"] <= 0:
        problem(f"{where}: gridPos {g} is not inside the 24-column grid")
    if p.get("datasource", {}).get("type") != "prometheus":
        problem(f"{where}: data source is not Prometheus")
    targets = p.get("targets", [])
    if not targets:
        problem(f"{where}: no targets")
    refs = set()
    for t in targets:
        if not t.get("refId") or t["refId"] in refs:
            problem(f"{where}: target refId missing or repeated")
        refs.add(t.get("refId"))
        expr = t.get("expr", "")
        names = re.findall(r"\b(spdld_[a-z0-9_]+)\b", expr)
        if not names:
            problem(f"{where}: target {t.get('refId')} queries no spdld metric: {expr!r}")
        for n in names:
            if not known(n):
                problem(f"{where}: {n} is not a metric spdld exports")
        exprs.append(expr)
for v in dash.get("templating", {}).get("list", []):
    if not v.get("name") or not v.get("type"):
        problem(f"template variable without name or type: {v}")
titles = " ".join(p.get("title", "").lower() for p in dash.get("panels", []))
for needed in ("samples/s per job", "client wait", "p99", "memory", "failures", "poisoned"):
    if needed not in titles:
        problem(f"no panel for {needed!r}")
# Operators must see a GPU that a sticky CUDA error poisoned (its jobs fail until spdld restarts).
if not any("spdld_gpu_device_poisoned" in e for e in exprs):
    problem("no panel queries spdld_gpu_device_poisoned (a poisoned GPU would go unseen)")

promtool = shutil.which("promtool")
if promtool:
    with tempfile.TemporaryDirectory() as tmp:
        rules = os.path.join(tmp, "rules.json")
        group = {"groups": [{"name": "grafana", "rules": [
            {"record": f"spdld:panel_query_{i}", "expr": e.replace("$instance", ".*")} for i, e in enumerate(exprs)]}]}
        with open(rules, "w") as f:
            json.dump(group, f)  # YAML is a superset of JSON
        r = subprocess.run([promtool, "check", "rules", rules], capture_output=True, text=True)
        if r.returncode != 0:
            problem("promtool check rules on the panel queries: " + (r.stdout + r.stderr).strip())
        else:
            print(f"ok: promtool parses all {len(exprs)} queries")
else:
    print("SKIPPED part: promtool not installed: the queries were not parsed as PromQL")

if problems:
    sys.exit(1)
print(f"OK: {dash_path}: {len(ids)} panels load; every query names exported metrics")
