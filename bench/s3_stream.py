#!/usr/bin/env python3
"""Time to the first batch of an s3 tar-shard job, streamed with a spdl-shard manifest vs scanned
without one (every shard downloaded through the header parse before the first batch, which is
what every s3 tar job did before streaming), and the same again with the node's shard cache warm.

A moto S3 server on 127.0.0.1 (moto[server], boto3), a real spdld (build/bin/spdld) and the Python
client (build/python). The shards hold one 256x256 JPEG repeated under distinct keys, so their size
is set by --shard-mib and decoding stays cheap. Usage (from the repository root):

  PYTHONPATH=build/python /usr/bin/python3 bench/s3_stream.py [--shards 8] [--shard-mib 32] [--repeats 3]

Prints one line per mode with the median seconds from Loader() to the first batch. Runs ~1 minute
at the defaults."""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ROOT / "build" / "python"))

import spdl_client  # noqa: E402
from PIL import Image  # noqa: E402
from s3_server import BUCKET, Moto  # noqa: E402


def jpeg() -> bytes:
    img = Image.effect_noise((256, 256), 64).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def shard(index: int, samples: int, image: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(samples):
            for ext, data in (("jpg", image), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"s{index:04d}/{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-mib", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="spdl-s3-stream-"))
    moto = Moto(tmp)
    proc = None
    try:
        image = jpeg()
        per = max(1, a.shard_mib * (1 << 20) // (len(image) + 1536))
        manifest = {"format": "spdl-shard", "version": 1, "shards": []}
        for s in range(a.shards):
            body = shard(s, per, image)
            for prefix in ("streamed", "scanned"):
                moto.s3.put_object(Bucket=BUCKET, Key=f"{prefix}/data-{s:06d}.tar", Body=body)
            manifest["shards"].append({"file": f"data-{s:06d}.tar", "samples": per, "bytes": len(body)})
        moto.s3.put_object(Bucket=BUCKET, Key="streamed/data.manifest.json", Body=json.dumps(manifest).encode())
        sock = str(tmp / "spdld.sock")
        cfg = tmp / "spdld.yaml"
        cache = tmp / "cache"
        cfg.write_text(f"socket_path: {sock}\nallowed_roots: [{tmp}]\nallowed_url_prefixes: [{moto.url}/{BUCKET}]\n"
                       f"log_level: warn\ncache_dir: {cache}\ncache_dir_bytes: 8GiB\n")
        proc = subprocess.Popen([str(ROOT / "build" / "bin" / "spdld"), "--config", str(cfg)],
                                stdout=open(tmp / "spdld.log", "wb"), stderr=subprocess.STDOUT)
        while not os.path.exists(sock):
            time.sleep(0.05)
        time.sleep(0.2)
        os.environ.update(AWS_ACCESS_KEY_ID=moto.key_id, AWS_SECRET_ACCESS_KEY=moto.secret,
                          AWS_ENDPOINT_URL=moto.url, AWS_REGION="us-east-1")

        def first_batch(prefix: str, seed: int) -> float:
            job = (f"source: {{type: tar, shards: 's3://{BUCKET}/{prefix}/data-{{000000..{a.shards - 1:06d}}}.tar'}}\n"
                   f"sampler: {{shuffle: true, seed: {seed}}}\nbatch: {{size: 32}}\n"
                   "transforms:\n  - resize: {shorter: 64}\n  - center_crop: {size: 64}\n")
            t0 = time.perf_counter()
            loader = spdl_client.Loader(job, socket=sock, epochs=1, timeout=600)
            try:
                next(iter(loader))
                return time.perf_counter() - t0
            finally:
                loader.close()

        print(f"{a.shards} shards of {per} samples ({a.shards * per} samples, "
              f"{a.shards * a.shard_mib} MiB) on moto at 127.0.0.1; median of {a.repeats}")
        # Cold: the cache emptied before each run (the daemon restarted with no files).
        for prefix, label in (("scanned", "no manifest (every shard first)"), ("streamed", "manifest (streamed)")):
            times = []
            for r in range(a.repeats):
                proc.send_signal(signal.SIGTERM)
                proc.wait()
                for f in cache.glob("*"):
                    f.unlink()
                proc = subprocess.Popen([str(ROOT / "build" / "bin" / "spdld"), "--config", str(cfg)],
                                        stdout=open(tmp / "spdld.log", "ab"), stderr=subprocess.STDOUT)
                while not os.path.exists(sock):
                    time.sleep(0.05)
                time.sleep(0.3)
                times.append(first_batch(prefix, r))
            print(f"  cold cache, {label:32s}: first batch {statistics.median(times):6.2f} s")
            warm = [first_batch(prefix, 100 + r) for r in range(a.repeats)]
            print(f"  warm cache, {label:32s}: first batch {statistics.median(warm):6.2f} s")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
        moto.close()


if __name__ == "__main__":
    main()
