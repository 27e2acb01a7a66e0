#!/usr/bin/env python3
"""Your own augmentation in the trainer: random erasing and mixup on whole batches, written as a
plain function and run by spdl_client on a few threads ahead of the training step.

    spdld --socket /tmp/spdld.sock --allow-root /data &
    python3 custom_transform.py --socket /tmp/spdld.sock --root /data/train --epochs 2 --threads 2

The daemon decodes, crops and flips (its built-in transforms, in C++); this function then turns
each uint8 batch into what the model wants: float, normalized, with torchvision-style random
erasing (one rectangle per image) and mixup (each image blended with another of the batch, the
labels too). Its randomness comes from `batch.seed`, a pure function of (sampler.seed, epoch,
batch index), so a resumed run augments every batch exactly as the run it continues would have.
It copies the batch (the float conversion), so the batch's slot goes back to the daemon as soon as
the function returns. With output.device: cuda the same function runs on the GPU batch.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy
import torch

import spdl_client

JOB = """
source: {type: image_folder}
sampler: {shuffle: true, seed: 42}
batch: {size: 16}
transforms:
  - random_resized_crop: {size: 56}
  - horizontal_flip: {p: 0.5}
prefetch: 4
"""

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def make_transform(num_classes: int, erase_p: float = 0.5, mixup_alpha: float = 0.2):
    """The batch transform: uint8 NHWC batch -> (float NCHW images, soft labels)."""

    def transform(batch: spdl_client.Batch):
        rng = numpy.random.default_rng(batch.seed)  # every draw from the batch's seed
        g = torch.Generator().manual_seed(int(rng.integers(2**63)))
        images = torch.from_dlpack(batch["image"])  # uint8 [B, H, W, 3], a view of the shared slot
        labels = torch.from_dlpack(batch["label"])
        x = images.permute(0, 3, 1, 2).float().div_(255)  # a copy: the slot is free once we return
        x = (x - MEAN.to(x.device)) / STD.to(x.device)
        b, _, h, w = x.shape
        # Random erasing: one rectangle of 2-20 % of the area per image, with probability erase_p.
        for i in range(b):
            if torch.rand((), generator=g) >= erase_p:
                continue
            area = h * w * (0.02 + 0.18 * torch.rand((), generator=g).item())
            eh = max(1, min(h, int(area**0.5)))
            ew = max(1, min(w, int(area / eh)))
            y0 = int(torch.randint(0, h - eh + 1, (), generator=g))
            x0 = int(torch.randint(0, w - ew + 1, (), generator=g))
            x[i, :, y0:y0 + eh, x0:x0 + ew] = torch.randn((3, eh, ew), generator=g).to(x.device)
        # Mixup: blend each image with a random other one of the batch.
        lam = float(rng.beta(mixup_alpha, mixup_alpha)) if mixup_alpha > 0 else 1.0
        perm = torch.randperm(b, generator=g).to(x.device)
        x = lam * x + (1 - lam) * x[perm]
        y = torch.nn.functional.one_hot(labels.long(), num_classes).float()
        y = lam * y + (1 - lam) * y[perm]
        return x, y

    return transform


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True, help="an image folder (one sub-folder per class)")
    p.add_argument("--socket", help="spdld's socket (default: $SPDLD_SOCKET or /run/spdld/spdld.sock)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="transform threads (0: inline in the loop)")
    args = p.parse_args()

    classes = sorted(d for d in os.listdir(args.root) if os.path.isdir(os.path.join(args.root, d)))
    loader = spdl_client.Loader(JOB, socket=args.socket, overrides={"source.root": os.path.abspath(args.root)},
                                epochs=args.epochs, transform=make_transform(len(classes)),
                                transform_threads=args.threads)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(48, len(classes)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with loader:
        for epoch in range(args.epochs):
            start, steps, total = time.monotonic(), 0, 0.0
            for x, y in loader:  # the transform's results, in batch order
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                steps += 1
                total += float(loss)
            print(f"epoch {epoch}: {steps} steps, mean loss {total / max(steps, 1):.3f}, "
                  f"{time.monotonic() - start:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
