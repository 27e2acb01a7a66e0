"""transform_executor="process" against a real spdld: FN on worker processes that map the job's
shared memory (no copy of the input batch), results in batch order (large arrays back through shared
memory), FN's exception surfaced with its batch and the loader closed, a worker killed with SIGKILL
mid-batch surfaced as TransformWorkerError naming the batch while the loader goes on with a new
worker, the workers gone with the loader (also when the trainer is SIGKILLed), and a GIL-holding
FN faster on 2 processes than on 2 threads.

The transforms are module-level functions (the workers import this module to unpickle them)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import spdl_client
from conftest import CLASSES, PER_CLASS, job_yaml, subprocess_env
from test_gpu import fake_gpu_daemon  # noqa: F401: the fixture

N = CLASSES * PER_CLASS  # 48 images


# ---- transforms (run in the workers) ----


def flip_fn(batch):
    """Uneven work (later batches may finish first); a large result (out of band) and small ones."""
    time.sleep(0.003 * (batch.batch_in_epoch % 3))
    image = batch["image"]
    return {
        "index": batch.batch_in_epoch,
        "epoch": batch.epoch,
        "paths": list(batch.paths),
        "seed": batch.seed,
        "pid": os.getpid(),
        "flipped": image[:, :, ::-1].copy(),
        "labels": np.from_dlpack(batch["label"]).copy(),
        # the input is the worker's own mapping of the job's region, not a copy sent to it
        "base": (type(image.base).__name__, len(image.base)),
    }


def torch_fn(batch):
    import torch

    image = torch.from_dlpack(batch["image"])
    return image.float().mean(dim=(1, 2)), torch.from_dlpack(batch["label"]).clone()


def sample_fn(sample):
    return {"mirror": sample["image"][:, ::-1].copy(), "label": np.int64(sample["label"])}


class Bad(Exception):
    pass


def raising_fn(batch):
    if batch.batch_in_epoch == 3:
        raise Bad(f"bad batch in pid {os.getpid()}")
    return batch.batch_in_epoch


class SlowOn:
    """Writes its pid to `path` and sleeps on batch `index` (long enough to be killed there)."""

    def __init__(self, index: int, path: str) -> None:
        self.index, self.path = index, path

    def __call__(self, batch):
        if batch.batch_in_epoch == self.index and batch.epoch == 0:
            with open(self.path + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(self.path + ".tmp", self.path)
            time.sleep(30)
        return batch.batch_in_epoch


def suicide_fn(batch):
    if batch.batch_in_epoch == 2 and batch.epoch == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return batch.batch_in_epoch


def _refuse_to_load():
    raise RuntimeError("this transform cannot be loaded in a worker")


class LoadsNowhere:
    """Pickles, but unpickling it (in a worker) raises."""

    def __call__(self, batch):
        return batch.batch_in_epoch

    def __reduce__(self):
        return _refuse_to_load, ()


def gil_fn(batch):
    """Pure Python, holding the GIL: ~tens of ms of bytecode per batch."""
    x = 0
    for i in range(GIL_LOOP):
        x = (x * 31 + i) & 0xFFFF
    return batch.batch_in_epoch, x


GIL_LOOP = 400_000


# ---- helpers ----


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout: float = 10.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def plain_epoch(make_loader, **kw) -> list:
    loader = make_loader(**kw)
    out = [(b.batch_in_epoch, list(b.paths), np.from_dlpack(b["image"]).copy()) for b in loader]
    loader.close()
    return out


# ---- tests ----


def test_results_in_order_from_worker_processes_that_map_the_slot(make_loader, dataset):
    ref = plain_epoch(make_loader, batch=4, prefetch=6)
    loader = make_loader(batch=4, prefetch=6, transform=flip_fn, transform_workers=2,
                         transform_executor="process")
    pool = loader._transform.processes
    pids = pool.pids
    assert len(pids) == 2 and os.getpid() not in pids
    for epoch in range(2):
        it = iter(loader)
        assert len(it) == N // 4
        got = list(it)
        assert [r["index"] for r in got] == list(range(N // 4))
        assert {r["epoch"] for r in got} == {epoch}
        assert {r["pid"] for r in got} <= set(pids)
        if epoch == 0:
            assert len({r["pid"] for r in got}) == 2  # both workers took batches
            for r, (i, paths, image) in zip(got, ref):
                assert r["paths"] == paths
                assert np.array_equal(r["flipped"], image[:, :, ::-1])
                assert r["labels"].tolist() == [dataset.label_of[p] for p in paths]
                assert r["base"] == ("mmap", loader.region_size())  # a view of the worker's mapping
        # The results are the trainer's own memory: every slot is back while they live.
        assert loader.held_batches == 0
        assert not r["flipped"].flags["OWNDATA"] and r["flipped"].flags["WRITEABLE"]
        seeds = [r["seed"] for r in got]
        assert len(set(seeds)) == len(seeds)
    assert sorted(pool.pids) == sorted(pids)  # started once
    loader.close()
    assert wait_gone(pids) == []  # the workers exit with the loader


def test_a_reopened_job_hands_its_new_region_to_the_workers(make_loader):
    """set_epoch far ahead reopens the job (a new shared region): the workers map it too."""
    plain = make_loader(batch=8, prefetch=3)
    plain.set_epoch(4)
    ref = [(list(b.paths), np.from_dlpack(b["image"]).copy()) for b in plain]
    plain.close()
    loader = make_loader(batch=8, prefetch=3, transform=flip_fn, transform_workers=2, transform_executor="process")
    assert [r["index"] for r in loader] == list(range(N // 8))
    old_job = loader.info["job_id"]
    loader.set_epoch(4)
    got = list(loader)
    assert loader.info["job_id"] != old_job  # reopened: a new job, a new region
    assert loader._transform.processes._state.region.id == 2
    assert [r["paths"] for r in got] == [p for p, _ in ref]
    for r, (_, image) in zip(got, ref):
        assert r["epoch"] == 4 and np.array_equal(r["flipped"], image[:, :, ::-1])
    assert loader.held_batches == 0


def test_a_loader_dropped_without_close_stops_its_workers(make_loader, daemon, dataset):
    loader = spdl_client.Loader(job_yaml(dataset.root, batch=4, prefetch=4), socket=daemon.socket, rank=0,
                                world_size=1, transform=flip_fn, transform_workers=2, transform_executor="process")
    pids = loader._transform.processes.pids
    it = iter(loader)
    next(it)
    del loader, it
    gc.collect()
    assert wait_gone(pids) == []


def test_torch_results_and_sample_transform_through_processes(make_loader, dataset):
    torch = pytest.importorskip("torch")
    ref = plain_epoch(make_loader, batch=8, prefetch=3, shuffle=False)
    loader = make_loader(batch=8, prefetch=3, shuffle=False, transform=torch_fn, transform_workers=2,
                         transform_executor="process")
    for (means, labels), (i, paths, image) in zip(loader, ref):
        assert isinstance(means, torch.Tensor) and means.shape == (8, 3)
        assert torch.allclose(means, torch.from_numpy(image).float().mean(dim=(1, 2)))
        assert labels.tolist() == [dataset.label_of[p] for p in paths]
    loader.close()

    loader = make_loader(batch=8, prefetch=3, shuffle=False, sample_transform=sample_fn, transform_workers=2,
                         transform_executor=multiprocessing.get_context("spawn"))
    got = list(loader)
    assert len(got) == len(ref)
    for out, (i, paths, image) in zip(got, ref):
        assert np.array_equal(out["mirror"], image[:, :, ::-1])
        assert out["label"].tolist() == [dataset.label_of[p] for p in paths]
    assert loader.held_batches == 0


def test_an_exception_in_a_worker_reaches_next_and_closes_the_loader(make_loader):
    loader = make_loader(batch=4, prefetch=4, transform=raising_fn, transform_workers=2,
                         transform_executor="process")
    pids = loader._transform.processes.pids
    it = iter(loader)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(Bad, match="bad batch in pid") as info:
        next(it)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "batch 3 of epoch 0" in notes
    assert "in transform worker pid" in notes and "raising_fn" in notes  # the worker's traceback
    assert loader.closed
    assert loader.held_batches == 0
    assert wait_gone(pids) == []


def test_a_worker_killed_mid_batch_is_an_error_naming_the_batch_and_the_loader_goes_on(make_loader, tmp_path):
    mark = str(tmp_path / "pid")
    loader = make_loader(batch=4, prefetch=4, transform=SlowOn(1, mark), transform_workers=2,
                         transform_executor="process")
    pool = loader._transform.processes
    it = iter(loader)
    assert next(it) == 0
    deadline = time.monotonic() + 20
    while not os.path.exists(mark):
        assert time.monotonic() < deadline, "batch 1 never reached a worker"
        time.sleep(0.01)
    victim = int(open(mark).read())
    assert victim in pool.pids
    os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(spdl_client.TransformWorkerError) as info:
        next(it)
    assert time.monotonic() - start < 5
    msg = str(info.value)
    assert "batch 1 of epoch 0" in msg and f"pid {victim}" in msg and "SIGKILL" in msg
    assert info.value.code == "ABORTED"
    # The loader goes on: the next batches, a replacement worker, nothing leaked.
    assert list(it) == list(range(2, N // 4))
    assert pool.restarts == 1 and victim not in pool.pids and len(pool.pids) == 2
    assert loader.state_dict()["epoch"] == 1  # the lost batch counts as consumed
    assert list(loader) == list(range(N // 4))  # the next epoch is whole
    assert loader.held_batches == 0
    pids = pool.pids
    loader.close()
    assert wait_gone(pids) == []


def test_a_worker_that_kills_itself_mid_batch(make_loader):
    loader = make_loader(batch=4, prefetch=4, transform=suicide_fn, transform_workers=1,
                         transform_executor="process")
    it = iter(loader)
    assert [next(it), next(it)] == [0, 1]
    with pytest.raises(spdl_client.TransformWorkerError,
                       match=r"SIGKILL while it ran the transform on batch 2 of epoch 0"):
        next(it)
    assert next(it) == 3
    assert not loader.closed
    loader.close()  # closing mid-epoch with batches in flight is clean too
    assert loader.held_batches == 0


def test_a_transform_that_cannot_load_in_the_workers_fails_clearly_and_closes_the_loader(make_loader):
    loader = make_loader(batch=4, prefetch=4, transform=LoadsNowhere(), transform_workers=2,
                         transform_executor="process")
    pids = loader._transform.processes.pids
    with pytest.raises(spdl_client.TransformWorkerError, match="could not load the transform function") as info:
        next(iter(loader))
    assert info.value.code == "FAILED_PRECONDITION"
    assert "this transform cannot be loaded in a worker" in str(info.value)
    assert "batch 0 of epoch 0" in str(info.value)
    assert loader.closed and loader.held_batches == 0
    assert wait_gone(pids) == []


def test_bad_arguments_are_refused_clearly(make_loader, daemon, dataset):
    yaml = job_yaml(dataset.root)
    with pytest.raises(TypeError, match="does not pickle.*module level"):
        spdl_client.Loader(yaml, socket=daemon.socket, transform=lambda b: b, transform_workers=1,
                           transform_executor="process")
    with pytest.raises(ValueError, match="start method 'fork'"):
        spdl_client.Loader(yaml, socket=daemon.socket, transform=flip_fn, transform_workers=1,
                           transform_executor=multiprocessing.get_context("fork"))
    with pytest.raises(ValueError, match="transform_workers >= 1"):
        spdl_client.Loader(yaml, socket=daemon.socket, transform=flip_fn, transform_executor="process")
    with pytest.raises(ValueError, match="'thread', 'process'"):
        spdl_client.Loader(yaml, socket=daemon.socket, transform=flip_fn, transform_workers=1,
                           transform_executor="processes")


def test_a_gpu_job_is_refused_with_the_process_executor(fake_gpu_daemon, dataset, monkeypatch):  # noqa: F811
    sock, fake = fake_gpu_daemon
    monkeypatch.setenv("SPDL_TEST_FAKE_GPU_DIR", fake)
    with pytest.raises(ValueError, match="works on CPU jobs.*cuda:0.*thread executor"):
        spdl_client.Loader(job_yaml(dataset.root, batch=8, extra="output: {device: cuda:0}\n"), socket=sock, rank=0,
                           world_size=1, transform=flip_fn, transform_workers=1, transform_executor="process")


TRAINER = textwrap.dedent("""
    import sys, time, spdl_client, test_process_executor as t
    loader = spdl_client.Loader(sys.argv[1], socket=sys.argv[2], rank=0, world_size=1, transform=t.flip_fn,
                                transform_workers=2, transform_executor="process")
    it = iter(loader)
    next(it)
    print(*loader._transform.processes.pids, flush=True)
    time.sleep(60)
""")


def test_workers_exit_when_the_trainer_is_killed(daemon, dataset, tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text(job_yaml(dataset.root, batch=4, prefetch=4))
    here = os.path.dirname(os.path.abspath(__file__))
    env = subprocess_env(PYTHONPATH=os.pathsep.join([here, subprocess_env().get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", TRAINER, str(cfg), daemon.socket], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip(), f"the trainer printed nothing; stderr:\n{proc.stderr.read()}"
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2 and all(alive(p) for p in pids)
        proc.kill()
        proc.wait()
        assert wait_gone(pids) == [], "transform workers outlived their SIGKILLed trainer"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _time_epoch(make_loader, executor: str) -> float:
    loader = make_loader(batch=4, prefetch=8, transform=gil_fn, transform_workers=2, transform_executor=executor)
    list(loader)  # warm up: the workers are up, the daemon's pipeline is running
    start = time.monotonic()
    out = list(loader)
    elapsed = time.monotonic() - start
    assert [i for i, _ in out] == list(range(N // 4))
    loader.close()
    return elapsed


def pure_work(_=None) -> int:
    x = 0
    for i in range(GIL_LOOP * 3):
        x = (x * 31 + i) & 0xFFFF
    return x


def machine_speedup(pool) -> float:
    """How much faster 2 bare processes run 4 units of pure Python work than 1 process does, now."""
    start = time.monotonic()
    for _ in range(4):
        pure_work()
    one = time.monotonic() - start
    start = time.monotonic()
    pool.map(pure_work, [0] * 4, chunksize=1)
    return one / (time.monotonic() - start)


def test_gil_holding_fn_runs_faster_on_two_processes_than_on_two_threads(make_loader):
    """The issue's figure: >= 1.6x on this 2-core machine. The machine is shared with other people's
    builds, and Linux shares the CPU between sessions (autogroups), not between processes: while
    other sessions keep the cores busy, this test's session gets about one core however many
    processes it runs. So each attempt first measures what 2 bare processes gain over 1 on pure
    Python work right now; the measurement is retried up to 3 times and the best ratio counts. When
    the machine never gave 2 bare processes 1.7x in 3 attempts, the figure cannot be measured and
    the test says SKIPPED with the figures (it is not a pass)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs at least 2 CPU cores")
    attempts = []
    with multiprocessing.get_context("forkserver").Pool(2) as pool:
        pool.map(pure_work, [0, 0])
        for attempt in range(3):
            bare = machine_speedup(pool)
            threads = _time_epoch(make_loader, "thread")
            processes = _time_epoch(make_loader, "process")
            attempts.append((bare, threads / processes))
            print(f"gil_fn, 12 batches: 2 threads {threads:.3f} s, 2 processes {processes:.3f} s, ratio "
                  f"{threads / processes:.2f}; 2 bare processes {bare:.2f}x (load {os.getloadavg()[0]:.1f})")
            if threads / processes >= 1.6:
                return
    best_bare = max(b for b, _ in attempts)
    ratios = ", ".join(f"{r:.2f}x (bare {b:.2f}x)" for b, r in attempts)
    if best_bare < 1.7:
        pytest.skip(f"the machine is too busy to measure 2 cores: 2 bare processes ran pure Python only "
                    f"{best_bare:.2f}x faster than 1 (load {os.getloadavg()[0]:.1f}); processes vs threads: {ratios}")
    pytest.fail(f"2 processes vs 2 threads on a GIL-holding FN: {ratios}; expected >= 1.6x")
