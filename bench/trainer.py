#!/usr/bin/python3
"""One trainer process of the benchmark: pulls every batch of a job from one loader and reports
what a training loop would see.

Run by run.py, never by hand (but it works by hand: see --help). The protocol with run.py:
  1. import everything (torch, the loader's module), build nothing yet, print "READY", flush;
  2. block until a line "GO" arrives on stdin (run.py sends it to every rank at once, so that
     start-up costs such as importing torch stay out of the measured window and the ranks start
     together);
  3. start the clock, create the loader, iterate every batch of every epoch, stop the clock;
  4. shut the loader down (DataLoader workers joined), then print one line "RESULT {json}"
     (with, for spdld, the daemon's final job statistics: per-stage busy time, first batch).

The "training step" does nothing but take the batch as torch tensors and touch one byte per 4 KiB
page of the image (as a copy to the GPU would have to), so the figures measure the loader.

Figures (all from this process's point of view):
  t_start      monotonic clock just before the loader (and, for the DataLoader, its dataset index)
               is created; CLOCK_MONOTONIC is system-wide, so run.py can compare ranks;
  t_first      when the first batch was in the trainer's hands;
  t_end        when the step on the last batch was done;
  wait_s       total time spent blocked in next() (and in iter() at each epoch start), not
               counting waits after the last batch (the end of the job, the loader stopping);
  cpu_self_s   user+system CPU of this process (all threads) from t_start until after shutdown;
  cpu_children_s  user+system CPU of this process's children reaped meanwhile (DataLoader workers).
"""
import argparse
import json
import os
import random
import sys
import time


def cpu_times():
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


def touch_pages(img):
    """Reads one byte of every 4 KiB page of a uint8 tensor (any layout, contiguous)."""
    flat = img.reshape(-1)
    return int(flat[::4096].sum())


def run_dataloader(a, torch):
    import torchvision
    from torchvision import transforms as T

    if a.recipe == "train":  # the training transform: random resized crop + flip, uint8
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])
    elif a.recipe == "randaug":  # config/examples/imagenet_train_randaug.yaml's recipe
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.RandAugment(num_ops=2, magnitude=9),
                        T.PILToTensor(), T.ConvertImageDtype(torch.float32),
                        T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]), T.RandomErasing(p=0.25)])
    else:
        tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])
    ds = torchvision.datasets.ImageFolder(a.root, transform=tf)
    if a.world_size > 1:
        sampler = torch.utils.data.distributed.DistributedSampler(
            ds, num_replicas=a.world_size, rank=a.rank, shuffle=True, seed=a.seed, drop_last=False)
    else:
        g = torch.Generator()
        g.manual_seed(a.seed)
        sampler = torch.utils.data.RandomSampler(ds, generator=g)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers, pin_memory=False,
        persistent_workers=a.workers > 0, drop_last=False)

    def epochs():
        for epoch in range(a.epochs):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
            yield iter(loader)

    def close():
        nonlocal loader
        # persistent workers live in loader._iterator; dropping the loader joins them, so that
        # their CPU time shows up in this process's children times.
        del loader

    return epochs(), (lambda b: (b[0], b[1])), close, (lambda: None)


def run_spdld(a, torch):
    import spdl_client

    overrides = {"source.root": a.root}
    for kv in a.set:  # --set KEY=VALUE: e.g. source.shards for tar shards, decode.resample
        k, _, v = kv.partition("=")
        overrides[k] = v
    if "source.shards" in overrides:
        del overrides["source.root"]
    kwargs = dict(socket=a.socket, rank=a.rank, world_size=a.world_size, overrides=overrides, epochs=a.epochs)
    if a.recipe == "randaug":  # the example trains with 256 and drop_last: measure the DataLoader's batching
        kwargs["overrides"].update({"batch.size": a.batch, "batch.drop_last": False})
    loader = spdl_client.Loader(a.config, **kwargs)

    def epochs():
        for _ in range(a.epochs):
            yield iter(loader)  # one epoch per iter(), as a DataLoader

    def batch(b):
        return torch.from_dlpack(b["image"]), torch.from_dlpack(b["label"])

    def close():
        nonlocal loader
        for name in ("close", "shutdown"):
            if hasattr(loader, name):
                getattr(loader, name)()
                break
        del loader

    def stats():
        try:
            st = loader.stats()  # the daemon's job statistics, once the job is done
        except Exception:  # noqa: BLE001  (an older binding without stats(): not essential)
            return None
        return st if st.get("finished") else None

    return epochs(), batch, close, stats


def run_spdl(a, torch):
    """SPDL (facebookresearch/spdl): its thread-based pipeline, as its ImageNet examples build it:
    read + demux + decode with an FFmpeg filter (scale shorter side to 256 bilinear, crop 224,
    rgb24) per image on a thread pool (one decoder thread per image), aggregate 32, convert the
    frames into one batch buffer."""
    import spdl.io
    from spdl.pipeline import PipelineBuilder

    classes = sorted(e.name for e in os.scandir(a.root) if e.is_dir())
    items = []
    for label, c in enumerate(classes):
        d = os.path.join(a.root, c)
        items += [(os.path.join(d, f), label) for f in sorted(os.listdir(d))
                  if f.lower().endswith((".jpg", ".jpeg"))]
    fd = ("scale=w='if(lt(iw,ih),256,-2)':h='if(lt(iw,ih),-2,256)':flags=bilinear,"
          "crop=224:224,format=rgb24")
    rng = random.Random(a.seed * 1000 + a.rank)

    def train_filter(w, h):
        """torchvision RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3) + a coin flip, as
        an FFmpeg filter: crop the window, scale it to 224x224 (bilinear), maybe mirror."""
        import math
        area = w * h
        for _ in range(10):
            target = area * rng.uniform(0.08, 1.0)
            ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
            if 0 < cw <= w and 0 < ch <= h:
                x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
                break
        else:
            cw, ch = min(w, h), min(w, h)
            x, y = (w - cw) // 2, (h - ch) // 2
        flip = ",hflip" if rng.random() < 0.5 else ""
        return f"crop={cw}:{ch}:{x}:{y},scale=224:224:flags=bilinear{flip},format=rgb24"
    # one FFmpeg thread per image: the pipeline runs images in parallel (FFmpeg's own threads
    # cost ~10% more CPU per image here)
    dc = spdl.io.decode_config(decoder_options={"threads": "1"})

    def decode(item):
        path, label = item
        with open(path, "rb") as f:
            data = f.read()
        packets = spdl.io.demux_image(data)
        f = train_filter(packets.width, packets.height) if a.recipe == "train" else fd
        return spdl.io.decode_packets(packets, filter_desc=f, decode_config=dc), label

    def collate(rows):
        buf = spdl.io.convert_frames([r[0] for r in rows])
        return spdl.io.to_torch(buf), torch.tensor([r[1] for r in rows], dtype=torch.int64)

    state = {"pipeline": None}

    def epochs():
        for epoch in range(a.epochs):
            order = list(items)
            random.Random(a.seed + epoch).shuffle(order)
            p = (PipelineBuilder().add_source(order)
                 .pipe(decode, concurrency=a.threads)
                 .aggregate(a.batch)
                 .pipe(collate)
                 .add_sink(a.prefetch)
                 .build(num_threads=a.threads))
            state["pipeline"] = p
            with p.auto_stop():
                yield iter(p.get_iterator())
            state["pipeline"] = None

    return epochs(), (lambda b: b), (lambda: None), (lambda: None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loader", choices=["dataloader", "spdld", "spdl"], required=True)
    ap.add_argument("--root", required=True, help="the image folder")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
    ap.add_argument("--threads", type=int, default=2, help="SPDL pipeline threads")
    ap.add_argument("--prefetch", type=int, default=4, help="SPDL sink buffer")
    ap.add_argument("--socket", help="spdld's control socket")
    ap.add_argument("--config", help="spdld job config (YAML path)")
    ap.add_argument("--no-wait", action="store_true", help="do not wait for GO on stdin")
    ap.add_argument("--recipe", choices=["eval", "train", "randaug"], default="eval",
                    help="the DataLoader's (and SPDL's) transforms: eval (Resize 256, CenterCrop 224), train "
                         "(RandomResizedCrop 224, RandomHorizontalFlip) or randaug (the training recipe of "
                         "config/examples/imagenet_train_randaug.yaml); spdld's come from --config")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="spdld: a job config override (e.g. source.shards=PATTERN, decode.resample=fast)")
    a = ap.parse_args()

    import torch
    torch.set_num_threads(1)  # the trainer does no compute; keep torch from starting a pool
    if a.loader == "spdld":
        import spdl_client  # noqa: F401  (fail before READY if it is missing)
    elif a.loader == "spdl":
        import spdl.io  # noqa: F401
        import spdl.pipeline  # noqa: F401
    else:
        import torchvision  # noqa: F401

    if not a.no_wait:
        print("READY", flush=True)
        line = sys.stdin.readline()
        if line.strip() != "GO":
            print(f"trainer: expected GO, got {line!r}", file=sys.stderr)
            return 2

    cpu0, child0 = cpu_times()
    t_start = time.monotonic()
    runner = {"dataloader": run_dataloader, "spdld": run_spdld, "spdl": run_spdl}[a.loader]
    epochs, to_tensors, close, stats = runner(a, torch)

    samples = batches = 0
    wait_s = pending = 0.0  # pending: waits not yet followed by a batch (dropped at the end)
    t_first = t_end = None
    sink = 0
    shapes = set()
    while True:
        t0 = time.monotonic()
        it = next(epochs, None)  # iter(loader) for the next epoch: may block (worker start-up)
        pending += time.monotonic() - t0
        if it is None:
            break
        while True:
            t0 = time.monotonic()
            try:
                b = next(it)
            except StopIteration:
                pending += time.monotonic() - t0
                break
            now = time.monotonic()
            wait_s += pending + (now - t0)
            pending = 0.0
            if t_first is None:
                t_first = now
            img, label = to_tensors(b)
            sink += touch_pages(img) + int(label.shape[0])
            samples += int(img.shape[0])
            batches += 1
            shapes.add((tuple(img.shape[1:]), str(img.dtype)))
            del img, label, b  # give the batch (the slot, the shared segment) back
            t_end = time.monotonic()
    t_end = t_end if t_end is not None else time.monotonic()
    t_first = t_first if t_first is not None else t_end
    daemon_stats = stats()
    close()
    del epochs
    import gc
    gc.collect()
    cpu1, child1 = cpu_times()
    t_closed = time.monotonic()

    out = {
        "loader": a.loader, "rank": a.rank, "world_size": a.world_size, "pid": os.getpid(),
        "samples": samples, "batches": batches, "t_start": t_start,
        "t_first": t_first, "t_end": t_end, "t_closed": t_closed, "wait_s": wait_s,
        "cpu_self_s": cpu1 - cpu0, "cpu_children_s": child1 - child0,
        "shapes": sorted(f"{s} {d}" for s, d in shapes), "sink": sink,
        "daemon_stats": daemon_stats,
    }
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
