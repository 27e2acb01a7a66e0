"""User transforms in the trainer (Loader(transform=, sample_transform=, transform_threads=)) against a
real spdld: results in batch order on 0, 1 and 4 threads, parallel calls, the per-sample form, an
exception surfaced with its batch and nothing leaked, batch.seed reproducible across a resume, and
the GPU batch passed through (on the test-only fake device)."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import spdl_client
from conftest import CLASSES, PER_CLASS, REPO, job_yaml, subprocess_env
from test_gpu import KDLCUDA, capsule_bytes, fake_gpu_daemon  # noqa: F401: the fixture

N = CLASSES * PER_CLASS  # 48 images


def transform_threads_alive() -> list:
    return [t.name for t in threading.enumerate() if t.name.startswith("spdl-transform")]


def plain_epoch(make_loader, **kw) -> list:
    """One epoch without a transform: per batch (batch_in_epoch, paths, a copy of the image)."""
    loader = make_loader(**kw)
    out = []
    for b in loader:
        out.append((b.batch_in_epoch, list(b.paths), np.from_dlpack(b["image"]).copy()))
        del b
    return out


@pytest.mark.parametrize("threads", [0, 1, 4])
def test_batch_transform_keeps_order_and_every_batch_once(make_loader, threads):
    ref = plain_epoch(make_loader, batch=4, prefetch=6)
    seen_threads = set()

    held = []

    def fn(batch):
        seen_threads.add(threading.current_thread().name)
        held.append(loader.held_batches)
        time.sleep(0.002 * (batch.batch_in_epoch % 3))  # uneven work: later batches may finish first
        image = np.from_dlpack(batch["image"])
        return {"index": batch.batch_in_epoch, "paths": list(batch.paths), "flipped": image[:, :, ::-1].copy()}

    loader = make_loader(batch=4, prefetch=6, transform=fn, transform_threads=threads)
    it = iter(loader)
    assert len(it) == len(loader) == N // 4
    got = list(it)
    assert [r["index"] for r in got] == list(range(N // 4))
    for r, (i, paths, image) in zip(got, ref):
        assert r["paths"] == paths
        assert np.array_equal(r["flipped"], image[:, :, ::-1])
    if threads == 0:
        assert seen_threads == {threading.current_thread().name}
    else:
        assert all(name.startswith("spdl-transform") for name in seen_threads)
        assert len(seen_threads) <= threads
    assert max(held) <= 6  # never more batches out than slots (prefetch 6)
    if threads > 0:
        assert max(held) >= 2  # ...but batches were taken ahead of the consumer
    del got
    assert loader.held_batches == 0  # fn copied: every slot is back
    # A second epoch through the same loader, and the state after it.
    assert [r["index"] for r in loader] == list(range(N // 4))
    assert loader.state_dict()["epoch"] == 2


def test_four_threads_run_a_sleeping_fn_in_parallel(make_loader):
    def fn(batch):
        time.sleep(0.020)
        return np.from_dlpack(batch["label"]).copy()

    def run(threads):
        loader = make_loader(batch=2, prefetch=8, transform=fn, transform_threads=threads)
        next(iter(loader))  # the job is running; time the rest of a fresh epoch
        start = time.monotonic()
        labels = list(iter(loader))
        elapsed = time.monotonic() - start
        loader.close()
        return elapsed, len(labels)

    serial, n1 = run(1)
    parallel, n4 = run(4)
    assert n1 == n4 == N // 2
    assert serial >= n1 * 0.020  # 24 calls of 20 ms one after the other
    print(f"24 batches, fn sleeping 20 ms: 1 thread {serial:.3f} s, 4 threads {parallel:.3f} s")
    assert parallel < 0.6 * serial


def test_sample_transform_collates_new_tensors(make_loader, dataset):
    ref = plain_epoch(make_loader, batch=8, prefetch=3)

    seeds = []

    def fn(sample):
        image = sample["image"]
        assert image.shape == (56, 56, 3) and isinstance(sample["path"], str)
        seeds.append(sample["seed"])
        return {
            "mean": image.reshape(-1, 3).mean(axis=0),
            "label": np.int64(sample["label"]),
            "mirror": image[:, ::-1].copy(),
            "path_len": len(sample["path"]),
        }

    loader = make_loader(batch=8, prefetch=3, sample_transform=fn, transform_threads=2)
    got = list(loader)
    assert len(got) == len(ref)
    for out, (i, paths, image) in zip(got, ref):
        assert out["mean"].shape == (8, 3) and out["mirror"].shape == (8, 56, 56, 3)
        assert np.allclose(out["mean"], image.reshape(8, -1, 3).mean(axis=1))
        assert np.array_equal(out["mirror"], image[:, :, ::-1])
        assert out["label"].tolist() == [dataset.label_of[p] for p in paths]
        assert out["path_len"].tolist() == [len(p) for p in paths]
    assert loader.held_batches == 0  # the results are copies: every slot went back
    assert len(set(seeds)) == N and all(isinstance(x, int) for x in seeds)  # a seed per sample

    with pytest.raises(ValueError, match="pass either transform= or sample_transform="):
        spdl_client.Loader("x: 1\n", transform=fn, sample_transform=fn)


@pytest.mark.parametrize("threads", [0, 2])
def test_an_exception_in_fn_reaches_next_with_its_batch_and_leaks_nothing(make_loader, daemon, threads):
    class Boom(Exception):
        pass

    calls = []

    def fn(batch):
        calls.append(batch.batch_in_epoch)
        if batch.batch_in_epoch == 3:
            raise Boom("bad batch")
        return np.from_dlpack(batch["image"])  # a view: keeps its slot while the result lives

    loader = make_loader(batch=4, prefetch=4, transform=fn, transform_threads=threads)
    core = loader._core  # its count of leased slots outlives the close
    results = []
    with pytest.raises(Boom, match="bad batch") as info:
        for r in loader:
            results.append(r.copy())
            del r
    notes = getattr(info.value, "__notes__", [])
    assert any("batch 3 of epoch 0" in n for n in notes), notes
    assert len(results) == 3
    assert loader.closed
    assert core.held == 0  # the batches taken ahead and the failing one: every slot given back
    del info
    deadline = time.monotonic() + 5
    while transform_threads_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert transform_threads_alive() == []
    with pytest.raises(spdl_client.SpdlError, match="closed"):
        iter(loader)
    # The daemon ended the job: a new one runs at once.
    assert sum(b.rows for b in make_loader(batch=16)) == N


def test_a_loader_dropped_mid_epoch_without_close_stops_its_threads_and_job(daemon, dataset):
    from test_loader_epochs import daemon_jobs

    before = {j["job_id"] for j in daemon_jobs(daemon.socket)}
    loader = spdl_client.Loader(job_yaml(dataset.root, batch=4, prefetch=4), socket=daemon.socket, rank=0,
                                world_size=1, transform=lambda b: b.rows, transform_threads=2)
    it = iter(loader)
    assert [next(it), next(it)] == [4, 4]
    time.sleep(0.1)  # the feeder is ahead, waiting for room
    del it, loader
    gc.collect()
    deadline = time.monotonic() + 5
    while (transform_threads_alive() or {j["job_id"] for j in daemon_jobs(daemon.socket)} - before) and \
            time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert transform_threads_alive() == []
    assert {j["job_id"] for j in daemon_jobs(daemon.socket)} - before == set()


def test_batch_seed_is_reproducible_across_a_resume(make_loader):
    def fn(batch):
        return (batch.epoch, batch.batch_in_epoch, batch.seed, list(batch.paths))

    full = make_loader(batch=4, prefetch=5, seed=11, transform=fn, transform_threads=4)
    whole = [list(full) for _ in range(2)]
    seeds = {(e, i): s for epoch in whole for (e, i, s, _) in epoch}
    assert len(set(seeds.values())) == len(seeds)  # a different seed per batch
    assert all(isinstance(s, int) and 0 <= s < 2**64 for s in seeds.values())

    first = make_loader(batch=4, prefetch=5, seed=11, transform=fn, transform_threads=4)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    time.sleep(0.1)  # let the feeder take batches ahead: the state must still be after batch 4
    state = first.state_dict()
    assert (state["epoch"], state["batch_in_epoch"]) == (0, 5)
    first.close()

    resumed = make_loader(batch=4, prefetch=5, seed=11, transform=fn, transform_threads=4)
    resumed.load_state_dict(state)
    rest = list(resumed) + list(resumed)
    assert head + rest == whole[0] + whole[1]

    # Another sampler seed, other batch seeds.
    other = make_loader(batch=4, prefetch=5, seed=12, transform=fn)
    assert [s for (_, _, s, _) in other] != [s for (_, _, s, _) in whole[0]]


def test_gpu_batches_reach_fn_on_the_device(fake_gpu_daemon, dataset, monkeypatch):  # noqa: F811
    sock, fake = fake_gpu_daemon
    monkeypatch.setenv("SPDL_TEST_FAKE_GPU_DIR", fake)
    with spdl_client.Loader(job_yaml(dataset.root, batch=8), socket=sock, epochs=1, rank=0, world_size=1) as cpu:
        ref = [np.from_dlpack(b["image"]).tobytes() for b in cpu]

    def fn(batch):
        t = batch["image"]
        assert t.__dlpack_device__() == (KDLCUDA, 0)
        dev, shape, data = capsule_bytes(t.__dlpack__(stream=1))
        return data

    with spdl_client.Loader(job_yaml(dataset.root, batch=8, extra="output: {device: cuda:0}\n"), socket=sock,
                            epochs=1, rank=0, world_size=1, transform=fn, transform_threads=2) as loader:
        assert loader.device == "cuda:0"
        got = list(loader)
    assert got == ref


def test_custom_transform_example_runs(daemon, dataset):
    out = subprocess.run(
        [sys.executable, str(REPO / "client/python/examples/custom_transform.py"), "--socket", daemon.socket,
         "--root", str(dataset.root), "--epochs", "2", "--threads", "2"],
        env=subprocess_env(), capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "epoch 1:" in out.stdout
