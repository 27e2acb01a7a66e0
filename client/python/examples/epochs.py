#!/usr/bin/env python3
"""The usual epoch loop over spdld, as with torch's DataLoader + DistributedSampler: set_epoch,
an early break out of an epoch, and checkpoint / resume at an epoch's end or in the middle of one.

    spdld --socket /tmp/spdld.sock --allow-root /data &
    python3 epochs.py --socket /tmp/spdld.sock --data /data/train --epochs 3 --checkpoint ck.pt
    python3 epochs.py ... --stop-after 100          # "preempted" after 100 steps (checkpoint saved)
    python3 epochs.py ... --resume                  # continues exactly there: same batches, same order
    torchrun --nproc_per_node 2 epochs.py ...       # RANK / WORLD_SIZE pick each rank's share

The model is a linear probe on 8x8-pooled pixels, so that the loop, not the model, is the point.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

import spdl_client

JOB = """
source: {type: image_folder}
sampler: {shuffle: true, seed: 42}
batch: {size: 32, drop_last: false}
transforms:
  - resize: {shorter: 64}
  - center_crop: {size: 56}
prefetch: 4
"""


def save(path: str, model, opt, loader, step: int) -> None:
    # The loader's state is plain JSON values: it goes into the checkpoint as it is.
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "loader": loader.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="an image folder (one sub-folder per class)")
    p.add_argument("--socket", help="spdld's socket (default: $SPDLD_SOCKET or /run/spdld/spdld.sock)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="job config override")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-batches-per-epoch", type=int, default=0, help="break out of each epoch after N batches")
    p.add_argument("--checkpoint", default="checkpoint.pt", help="saved at each epoch's end and by --stop-after")
    p.add_argument("--checkpoint-every", type=int, default=0, help="also save every N steps (mid-epoch)")
    p.add_argument("--stop-after", type=int, default=0, help="save and exit after N steps (a preemption)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--record", help="append one JSON line per step: epoch, batch_in_epoch, paths")
    args = p.parse_args()

    overrides = [f"source.root={os.path.abspath(args.data)}"] + args.set
    # rank / world_size come from $RANK / $WORLD_SIZE (torchrun); the job keeps running between epochs.
    loader = spdl_client.Loader(JOB, socket=args.socket, overrides=overrides, epochs=args.epochs)
    classes = loader.classes or []
    model = torch.nn.Linear(3 * 8 * 8, max(len(classes), 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step, first_epoch = 0, 0
    if args.resume:
        ck = torch.load(args.checkpoint)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        loader.load_state_dict(ck["loader"])  # the next iter() continues from the saved batch
        step, first_epoch = ck["step"], ck["loader"]["epoch"]
    record = open(args.record, "a") if args.record else None

    for epoch in range(first_epoch, args.epochs):
        loader.set_epoch(epoch)  # as DistributedSampler.set_epoch (a no-op for the resumed epoch)
        model.train()
        for i, batch in enumerate(loader):  # one epoch: len(loader) batches (fewer when resumed)
            images = torch.from_dlpack(batch["image"])  # uint8 [B, 56, 56, 3], zero copy
            x = F.adaptive_avg_pool2d(images.permute(0, 3, 1, 2).float() / 255, 8).flatten(1)
            y = torch.from_dlpack(batch["label"]).clone()
            del images
            if record:
                record.write(json.dumps({"epoch": batch.epoch, "batch": batch.batch_in_epoch, "paths": batch.paths}) + "\n")
            batch.release()  # the daemon may refill the slot while the model computes
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save(args.checkpoint, model, opt, loader, step)  # mid-epoch: the loader's exact position
            if args.stop_after and step == args.stop_after:
                save(args.checkpoint, model, opt, loader, step)
                print(f"stopped after {step} steps (epoch {epoch}); resume with --resume", flush=True)
                return 0
            if args.max_batches_per_epoch and i + 1 >= args.max_batches_per_epoch:
                break  # the rest of this epoch is dropped: the next iter() starts the next epoch
        save(args.checkpoint, model, opt, loader, step)  # at the epoch's end: the next epoch's start
        print(f"epoch {epoch}: {step} steps so far, loss {loss.item():.4f}", flush=True)
    loader.close()
    if record:
        record.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
