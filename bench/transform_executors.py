#!/usr/bin/python3
"""Threads or processes for the Python transform hook: `Loader(transform=FN, transform_workers=2,
transform_executor="thread" | "process")` against a real spdld, for an FN that holds the GIL (a pure
Python loop) and one that releases it (torch ops), with the machine's own 2-process speedup on the
same pure-Python work as the reference. Prints one line per figure; ~1 min on 2 cores.

  /usr/bin/python3 bench/transform_executors.py --build-dir build [--epochs 3] [--batch 8]

Needs BUILD/bin/spdld, BUILD/bin/spdl-make-dataset and BUILD/python/spdl_client; torch for the
GIL-releasing FN (skipped, saying so, without it). The dataset (96 small JPEGs) and the daemon live
in a temporary directory, removed at the end. Each figure is the best of `--epochs` timed epochs
after a warm-up epoch (worker start-up is not in it): the machine may be shared, and the best
epoch is the one least disturbed by others. `load` is the 1-minute load average when it ran.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket as socketlib
import subprocess
import sys
import tempfile
import time

GIL_LOOP = 1_000_000  # ~50 ms per call on an idle core: well above the daemon's decode per batch


def gil_fn(batch):
    """Pure Python, holding the GIL for the whole call."""
    x = 0
    for i in range(GIL_LOOP):
        x = (x * 31 + i) & 0xFFFF
    return batch.batch_in_epoch, x


def torch_fn(batch):
    """torch ops on the batch (they release the GIL): float, normalize, a 3x3 box blur, a copy out."""
    import torch

    torch.set_num_threads(1)  # one core per call, for threads and processes alike
    x = torch.from_dlpack(batch["image"]).permute(0, 3, 1, 2).float().div_(255.0)
    for _ in range(24):
        x = torch.nn.functional.avg_pool2d(x, 3, stride=1, padding=1)
    return x.sub_(0.5).mul_(2.0), torch.from_dlpack(batch["label"]).clone()


def pure_work(_=None):
    x = 0
    for i in range(GIL_LOOP):
        x = (x * 31 + i) & 0xFFFF
    return x


def machine_speedup(ctx) -> float:
    """Seconds for 4 units of pure Python work on 1 process / on 2 processes (best of 3)."""
    with ctx.Pool(2) as pool:
        pool.map(pure_work, [0, 0])
        one, two = [], []
        for _ in range(3):
            start = time.monotonic()
            for _ in range(4):
                pure_work()
            one.append(time.monotonic() - start)
            start = time.monotonic()
            pool.map(pure_work, [0] * 4, chunksize=1)
            two.append(time.monotonic() - start)
    return min(one) / min(two)


def connectable(path: str) -> bool:
    s = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def job(root: str, batch: int) -> str:
    return (f"source: {{type: image_folder, root: {root}}}\n"
            "sampler: {shuffle: true, seed: 1}\n"
            f"batch: {{size: {batch}, drop_last: false}}\n"
            "transforms:\n  - resize: {shorter: 64}\n  - center_crop: {size: 56}\n"
            "prefetch: 6\n")


def time_inline(spdl_client, sock: str, cfg: str, fn) -> float:
    """FN's own time per call: the median over one epoch of calls on this thread."""
    import statistics

    loader = spdl_client.Loader(cfg, socket=sock, rank=0, world_size=1)
    try:
        times = []
        for batch in loader:
            start = time.monotonic()
            fn(batch)
            times.append(time.monotonic() - start)
            del batch
        return statistics.median(times)
    finally:
        loader.close()


def time_executor(spdl_client, sock: str, cfg: str, fn, executor: str, workers: int, epochs: int) -> tuple:
    loader = spdl_client.Loader(cfg, socket=sock, rank=0, world_size=1, transform=fn, transform_workers=workers,
                                transform_executor=executor)
    try:
        list(loader)  # warm-up: workers started and FN imported, the daemon's pipeline running
        times = []
        for _ in range(epochs):
            start = time.monotonic()
            n = sum(1 for _ in loader)
            times.append(time.monotonic() - start)
        return min(times), n
    finally:
        loader.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", default="build")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per figure (the best counts)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    build = os.path.abspath(args.build_dir)
    sys.path.insert(0, os.path.join(build, "python"))
    import spdl_client

    ctx = multiprocessing.get_context("forkserver")
    with tempfile.TemporaryDirectory(prefix="spdl-texec-") as tmp:
        data = os.path.join(tmp, "data")
        subprocess.run([os.path.join(build, "bin", "spdl-make-dataset"), data, "--classes", "4", "--per-class", "24",
                        "--min-side", "64", "--max-side", "128"], check=True, stdout=subprocess.DEVNULL)
        sock = os.path.join(tmp, "s.sock")
        daemon = subprocess.Popen([os.path.join(build, "bin", "spdld"), "--socket", sock, "--allow-root", tmp,
                                   "--threads", "2", "--log-level", "warn"])
        try:
            deadline = time.monotonic() + 10
            while not connectable(sock):
                if daemon.poll() is not None or time.monotonic() > deadline:
                    print("spdld did not start", file=sys.stderr)
                    return 2
                time.sleep(0.01)
            cfg = job(data, args.batch)
            print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
                  f"2 bare processes vs 1 on pure Python: {machine_speedup(ctx):.2f}x")
            fns = [("GIL-holding (pure Python loop)", gil_fn)]
            try:
                import torch  # noqa: F401

                fns.append(("GIL-releasing (torch ops)", torch_fn))
            except ImportError:
                print("GIL-releasing (torch ops): skipped, torch is not installed")
            for label, fn in fns:
                print(f"{label}: {time_inline(spdl_client, sock, cfg, fn) * 1000:.1f} ms per call inline")
                res = {}
                for executor in ("thread", "process"):
                    res[executor], n = time_executor(spdl_client, sock, cfg, fn, executor, args.workers, args.epochs)
                    print(f"{label}: {args.workers} {executor} workers: {res[executor]:.3f} s/epoch, "
                          f"{n / res[executor]:.1f} batches/s (load {os.getloadavg()[0]:.1f})")
                print(f"{label}: processes vs threads: {res['thread'] / res['process']:.2f}x")
        finally:
            daemon.terminate()
            daemon.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
