#!/usr/bin/env python3
"""Scrapes a Prometheus endpoint with a real HTTP GET and parses it with prometheus_client's parser.

Usage: scrape.py URL [RAW_FILE]. Prints JSON: {"status": HTTP status, "content_type": ...,
"samples": {"name{k=v,...}": value}, "types": {family: type}}; with RAW_FILE, also writes the body
there as served (for `promtool check metrics`). Exit 77 when prometheus_client is missing (apt-get install
python3-prometheus-client)."""
import json
import sys
import urllib.error
import urllib.request

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("prometheus_client missing: apt-get install python3-prometheus-client", file=sys.stderr)
    sys.exit(77)

try:
    with urllib.request.urlopen(sys.argv[1], timeout=10) as r:
        status, ctype, body = r.status, r.headers.get("Content-Type", ""), r.read().decode()
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code}))
    sys.exit(0)

if len(sys.argv) > 2:
    with open(sys.argv[2], "w") as f:
        f.write(body)

samples, types = {}, {}
for fam in text_string_to_metric_families(body):
    types[fam.name] = fam.type
    for s in fam.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        samples[s.name + ("{" + labels + "}" if labels else "")] = s.value
print(json.dumps({"status": status, "content_type": ctype, "samples": samples, "types": types}))
