#!/usr/bin/env python3
"""Streams (issue 21): producer put -> batch in the trainer, latency p50/p99 at fixed put rates, and
the highest sustained rate, on this machine (short runs).

A real spdld (BUILD/bin/spdld), one Python producer thread putting small real JPEGs (label = the
sample's number, its put time kept here) and one stream job (batch 16, max_batch_delay_ms 5) read
by a Loader in another thread: the latency of a sample is from the start of its put to the moment
the trainer holds the batch that carries it (same clock, one process).

    /usr/bin/python3 bench/stream_bench.py [--build build] [--seconds 5] [--rates 100,1000] [--put-many 64]

With --put-many K the producer sends the samples that are due (at most K) with one
Producer.put_many (pipelined puts, not one round trip each); without it, one put per sample.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


def jpeg(i: int, side: int = 32) -> bytes:
    from PIL import Image

    img = Image.fromarray(np.random.default_rng(i).integers(0, 255, (side, side, 3), dtype=np.uint8))
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=85)
    return out.getvalue()


def run(spdl_client, sock: str, name: str, rate: float, seconds: float, images: list, put_many: int = 0) -> dict:
    """Puts at `rate` samples/s (0: as fast as it goes) for `seconds`; returns the figures."""
    yaml_text = (f"source: {{type: stream, name: {name}, group: bench}}\nbatch: {{size: 16}}\n"
                 "max_batch_delay_ms: 5\ntransforms:\n  - resize: {shorter: 32}\n  - center_crop: {size: 32}\n"
                 "prefetch: 4\n")
    producer = spdl_client.Producer(name, socket=sock, max_samples=4096)
    loader = spdl_client.Loader(yaml_text, socket=sock, rank=0, world_size=1, epochs=1, timeout=60)
    put_at: dict = {}
    got_at: dict = {}

    def consume():
        for batch in loader:
            now = time.perf_counter()
            for x in np.from_dlpack(batch["label"]):
                got_at[int(x)] = now
            del batch

    t = threading.Thread(target=consume)
    t.start()
    start = time.perf_counter()
    i = 0
    while True:
        now = time.perf_counter()
        if now - start >= seconds:
            break
        if rate > 0:
            due = start + i / rate
            if due > now:
                time.sleep(due - now)
        if put_many > 0:
            # The samples due now (all K at the highest rate), put with one put_many.
            n = put_many if rate <= 0 else max(1, min(put_many, int((time.perf_counter() - start) * rate) - i + 1))
            t0 = time.perf_counter()
            for k in range(i, i + n):
                put_at[k] = t0
            producer.put_many([images[k % len(images)] for k in range(i, i + n)], labels=list(range(i, i + n)))
            i += n
            continue
        put_at[i] = time.perf_counter()
        producer.put(images[i % len(images)], label=i)
        i += 1
    put_seconds = time.perf_counter() - start
    producer.close(end_stream=True)
    t.join(120)
    end = max(got_at.values()) if got_at else time.perf_counter()
    loader.close()
    lat = np.array([got_at[k] - put_at[k] for k in put_at if k in got_at]) * 1e3
    return {
        "rate": rate, "samples": i, "received": len(got_at),
        "put_rate": i / put_seconds, "delivered_rate": len(got_at) / (end - start),
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(Path(__file__).resolve().parents[1] / "build"))
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--rates", default="100,1000")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--put-many", type=int, default=0, help="send up to K due samples per put_many (0: put)")
    a = ap.parse_args()
    build = Path(a.build).resolve()
    sys.path.insert(0, str(build / "python"))
    import spdl_client

    images = [jpeg(i) for i in range(256)]
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "s.sock")
        log = open(os.path.join(tmp, "spdld.log"), "wb")
        d = subprocess.Popen([str(build / "bin" / "spdld"), "--socket", sock, "--allow-root", tmp, "--threads",
                              str(a.threads), "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 10
            while not os.path.exists(sock) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.1)
            rows = []
            for n, rate in enumerate([float(r) for r in a.rates.split(",")] + [0.0]):
                rows.append(run(spdl_client, sock, f"bench{n}", rate, a.seconds, images, a.put_many))
            print(f"puts: {'put_many of up to ' + str(a.put_many) if a.put_many else 'one put per sample'}; "
                  f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
            print(f"{'put rate':>10} {'samples':>8} {'received':>8} {'put/s':>8} {'delivered/s':>11} "
                  f"{'p50 ms':>8} {'p99 ms':>8}")
            for r in rows:
                label = "max" if r["rate"] == 0 else f"{r['rate']:.0f}/s"
                print(f"{label:>10} {r['samples']:8d} {r['received']:8d} {r['put_rate']:8.0f} "
                      f"{r['delivered_rate']:11.0f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f}")
        finally:
            d.terminate()
            try:
                d.wait(15)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
            log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
