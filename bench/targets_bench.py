#!/usr/bin/env python3
"""What boxes and masks cost: the same 200 JPEGs (480x360, 8 annotated objects each) through
spdld as an image folder (no targets), a coco source (boxes) and a coco source with masks: true
(polygons rasterised and moved), Resize(256) + CenterCrop(224) + flip, batches of 20, 2 epochs,
samples/s per pass (repeats alternate the three jobs). Starts its own spdld from the build tree.

    python3 bench/targets_bench.py [--build build] [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image


def make_data(root: Path) -> None:
    rng = np.random.default_rng(0)
    (root / "c").mkdir(parents=True)
    images, anns = [], []
    y, x = np.mgrid[0:360, 0:480]
    for i in range(200):
        img = np.stack([(x * 0.5 + i) % 256, (y * 0.7) % 256, (x + y) % 256], -1).astype(np.uint8)
        Image.fromarray(img).save(root / "c" / f"{i:04d}.jpg", quality=90)
        images.append({"id": i, "file_name": f"c/{i:04d}.jpg"})
        for k in range(8):
            bx, by, bw, bh = rng.uniform(0, 400), rng.uniform(0, 300), rng.uniform(10, 80), rng.uniform(10, 60)
            anns.append({"image_id": i, "category_id": 1 + k % 5, "bbox": [bx, by, bw, bh], "iscrowd": 0,
                         "segmentation": [[bx, by, bx + bw, by, bx + bw, by + bh, bx, by + bh]]})
    (root / "ann.json").write_text(json.dumps({"images": images, "annotations": anns,
                                               "categories": [{"id": c} for c in range(1, 6)]}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    build = Path(args.build).resolve()
    sys.path.insert(0, str(build / "python"))
    import spdl_client

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        make_data(root)
        sock = str(Path(tmp) / "s.sock")
        daemon = subprocess.Popen([str(build / "bin" / "spdld"), "--socket", sock, "--allow-root", tmp,
                                   "--threads", str(args.threads), "--log-level", "warn"])
        try:
            deadline = time.monotonic() + 10
            while not Path(sock).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            t = "transforms:\n  - resize: {shorter: 256}\n  - center_crop: {size: 224}\n  - horizontal_flip: {p: 0.5}\n"
            coco = f"source: {{type: coco, annotations: {root}/ann.json, root: {root}"
            jobs = {
                "image_folder (no targets)": f"source: {{type: image_folder, root: {root}}}\nbatch: {{size: 20}}\n{t}",
                "coco: boxes": f"{coco}}}\nbatch: {{size: 20}}\n{t}",
                "coco: boxes + masks": f"{coco}, masks: true}}\nbatch: {{size: 20}}\n{t}",
            }
            rates = {name: [] for name in jobs}
            for cfg in jobs.values():  # warm-up: page cache, decoders, the parsed JSON
                loader = spdl_client.Loader(cfg, socket=sock, rank=0, world_size=1, epochs=1)
                for _ in loader:
                    pass
                loader.close()
            for _ in range(args.repeats):
                for name, cfg in jobs.items():
                    loader = spdl_client.Loader(cfg, socket=sock, rank=0, world_size=1, epochs=2)
                    start, n = time.perf_counter(), 0
                    for _ in range(2):
                        for batch in loader:
                            n += batch.rows
                    rates[name].append(n / (time.perf_counter() - start))
                    loader.close()
            for name, r in rates.items():
                print(f"{name:28s} median {np.median(r):7.0f} samples/s  ({', '.join(f'{v:.0f}' for v in r)})")
        finally:
            daemon.terminate()
            daemon.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
