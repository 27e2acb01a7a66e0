#!/usr/bin/env python3
"""spdld with plain numpy: each batch's image and label as zero-copy numpy arrays, per-class pixel
means over one epoch. No deep-learning framework needed.

    spdld --socket /tmp/spdld.sock --allow-root /data &
    python3 numpy_example.py --socket /tmp/spdld.sock --data /data/train
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import spdl_client

JOB = """
source: {type: image_folder}
sampler: {shuffle: true, seed: 0}
batch: {size: 16, drop_last: false}
transforms:
  - resize: {shorter: 64}
  - center_crop: {size: 56}
prefetch: 3
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="an image folder (one sub-folder per class)")
    p.add_argument("--socket", help="spdld's socket (default: $SPDLD_SOCKET or /run/spdld/spdld.sock)")
    args = p.parse_args()

    with spdl_client.Loader(JOB, socket=args.socket, overrides={"source.root": os.path.abspath(args.data)},
                            epochs=1) as loader:
        classes = loader.classes or []
        sums = np.zeros((max(len(classes), 1), 3))
        counts = np.zeros(len(sums), dtype=np.int64)
        for batch in loader:
            images = np.from_dlpack(batch["image"])  # uint8 [B, 56, 56, 3]: the slot's memory, no copy
            labels = np.from_dlpack(batch["label"])  # int64 [B]
            assert images.ctypes.data == batch["image"].data_ptr
            np.add.at(sums, labels, images.reshape(len(images), -1, 3).mean(axis=1))
            np.add.at(counts, labels, 1)
            del images, labels, batch  # the slot goes back to the daemon
        for c, name in enumerate(classes):
            print(f"{name}: {counts[c]} images, mean RGB {np.round(sums[c] / max(counts[c], 1), 1).tolist()}")
        print(f"samples: {int(counts.sum())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
