#!/usr/bin/env python3
"""Draw the boxes (and the mask, if the job has one) of one batch onto its images and save a PNG:
what to look at to trust a detection pipeline — the boxes must sit on the objects after every
resize, crop and flip the job applies.

    spdld --socket /tmp/spdld.sock --allow-root /data &
    python3 draw_boxes.py --socket /tmp/spdld.sock --config config/examples/coco_detection.yaml \\
        --set source.annotations=/data/coco/annotations/instances_val2017.json \\
        --set source.root=/data/coco/val2017 --out boxes.png

The batch's `image` must be uint8 (output.dtype: uint8, the default); NHWC or NCHW.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from PIL import Image, ImageDraw

import spdl_client

PALETTE = [(255, 64, 64), (64, 200, 64), (64, 128, 255), (255, 200, 0), (200, 64, 255), (0, 220, 220)]


def render(batch, columns: int = 4) -> Image.Image:
    """One image: the batch's rows in a grid, each with its boxes drawn and labelled, and its mask
    (when the batch has one) tinted over it."""
    images = np.asarray(batch["image"])
    if images.dtype != np.uint8:
        raise SystemExit(f"draw_boxes needs output.dtype: uint8 (this batch's image is {images.dtype})")
    if images.shape[1] in (1, 3) and images.shape[-1] not in (1, 3):  # NCHW -> NHWC
        images = images.transpose(0, 2, 3, 1)
    if images.shape[-1] == 1:
        images = np.repeat(images, 3, axis=-1)
    names = set(batch.keys())
    boxes = np.asarray(batch["boxes"]) if "boxes" in names else None
    labels = np.asarray(batch["box_labels"]) if "box_labels" in names else None
    counts = np.asarray(batch["box_count"]) if "box_count" in names else None
    masks = np.asarray(batch["mask"]) if "mask" in names else None
    n, h, w = images.shape[0], images.shape[1], images.shape[2]
    rows = (n + columns - 1) // columns
    sheet = Image.new("RGB", (columns * w, rows * h), (0, 0, 0))
    for i in range(n):
        img = images[i].astype(np.float32)
        if masks is not None:
            m = masks[i]
            tint = np.array([PALETTE[v % len(PALETTE)] for v in range(256)], np.float32)[m]
            img = np.where(m[..., None] > 0, 0.5 * img + 0.5 * tint, img)
        tile = Image.fromarray(img.clip(0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(tile)
        if boxes is not None:
            for k in range(int(counts[i])):
                x1, y1, x2, y2 = (float(v) for v in boxes[i, k])
                colour = PALETTE[int(labels[i, k]) % len(PALETTE)]
                draw.rectangle([x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)], outline=colour, width=2)
                draw.text((x1 + 2, y1 + 1), str(int(labels[i, k])), fill=colour)
        sheet.paste(tile, ((i % columns) * w, (i // columns) * h))
    return sheet


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", default="/run/spdld/spdld.sock")
    p.add_argument("--config", required=True, help="a job config with a coco source (or a mask)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key of the config")
    p.add_argument("--out", default="boxes.png")
    args = p.parse_args(argv)
    overrides = dict(kv.split("=", 1) for kv in args.set)
    loader = spdl_client.Loader(args.config, socket=args.socket, overrides=overrides, rank=0, world_size=1)
    try:
        batch = next(iter(loader))
        sheet = render(batch)
        counts = np.asarray(batch["box_count"]).tolist() if "box_count" in batch.keys() else []
        del batch  # release the slot before the loader closes
    finally:
        loader.close()
    sheet.save(args.out)
    print(f"wrote {args.out}: {sheet.width}x{sheet.height}, boxes per image {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
