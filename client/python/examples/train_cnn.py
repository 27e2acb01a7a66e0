#!/usr/bin/env python3
"""Train a tiny CNN on CPU with batches from spdld: a starting point to copy.

One process per rank, as torchrun starts them (RANK / WORLD_SIZE in the environment; with
WORLD_SIZE > 1 and MASTER_ADDR set it also joins a gloo process group and wraps the model in DDP).
The node's spdld decodes, resizes and crops the images; this process only trains:

    spdld --socket /tmp/spdld.sock --allow-root /data &
    python3 train_cnn.py --socket /tmp/spdld.sock --data /data/imagenet/train --max-steps 100
    torchrun --nproc_per_node 2 train_cnn.py --data /data/imagenet/train      # two ranks

Each batch arrives as uint8 NHWC images in shared memory (zero copy); the step turns them into
normalized float NCHW (the one copy a model needs anyway) and drops the views at once, so the daemon
can refill the slot while the model computes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import spdl_client

# The job when no --config is given: ImageNet-style resize + center crop to 224, uint8 NHWC.
DEFAULT_JOB = """
source: {type: image_folder, root: /var/lib/spdld/sample}
sampler: {shuffle: true, seed: 42}
batch: {size: 32, drop_last: false}
transforms:
  - resize: {shorter: 256}
  - center_crop: {size: 224}
prefetch: 4
"""

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


class TinyCNN(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(32, 64, kernel_size=3, stride=2, padding=1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def to_model_input(batch: spdl_client.Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 [B,H,W,3] in shared memory -> normalized float [B,3,H,W] of our own, int64 labels."""
    images = torch.from_dlpack(batch["image"])  # a view: no copy
    labels = torch.from_dlpack(batch["label"])
    x = (images.permute(0, 3, 1, 2).float() - MEAN) / STD  # the copy the model needs anyway
    y = labels.clone()
    return x, y  # the views die here; batch.release() then gives the slot back at once


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="job config (YAML file); default: a built-in ImageNet-style job")
    p.add_argument("--data", help="dataset root (an image folder: one sub-folder per class)")
    p.add_argument("--socket", help="spdld's socket (default: $SPDLD_SOCKET or /run/spdld/spdld.sock)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    p.add_argument("--batch-size", type=int, help="samples per batch (per rank)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: run the whole job)")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=10)
    args = p.parse_args()

    torch.manual_seed(0)
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    distributed = world_size > 1 and "MASTER_ADDR" in os.environ
    if distributed:
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)

    model: nn.Module = TinyCNN(args.num_classes)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    overrides = list(args.set)
    if args.data:
        overrides.append(f"source.root={os.path.abspath(args.data)}")
    if args.batch_size:
        overrides.append(f"batch.size={args.batch_size}")

    # rank / world_size default to $RANK / $WORLD_SIZE: every rank gets its own share of each epoch.
    with spdl_client.Loader(args.config or DEFAULT_JOB, socket=args.socket, overrides=overrides,
                            epochs=args.epochs) as loader:
        print(f"rank {rank}/{world_size}: {len(loader)} batches/epoch of {loader.info['batch_size']}, "
              f"{args.epochs} epoch(s)", flush=True)
        model.train()
        step, samples, t0 = 0, 0, time.perf_counter()
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)  # as DistributedSampler.set_epoch: the next iter() yields this epoch
            for batch in loader:  # one epoch: len(loader) batches
                x, y = to_model_input(batch)
                batch.release()  # nothing refers to the slot any more: the daemon can refill it now
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step += 1
                samples += y.numel()
                if step % args.log_every == 0 or step == 1:
                    rate = samples / (time.perf_counter() - t0)
                    print(f"rank {rank} epoch {epoch} step {step}: loss {loss.item():.4f} ({rate:.0f} samples/s)",
                          flush=True)
                if args.max_steps and step >= args.max_steps:
                    break
            if args.max_steps and step >= args.max_steps:
                break
        elapsed = time.perf_counter() - t0
        stats = loader.stats()
    print(f"rank {rank}: {step} steps, {samples} samples in {elapsed:.2f} s ({samples / max(elapsed, 1e-9):.0f} samples/s); "
          f"last loss {loss.item() if step else float('nan'):.4f}; daemon skipped {stats['skipped']} bad samples",
          flush=True)
    if distributed:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
