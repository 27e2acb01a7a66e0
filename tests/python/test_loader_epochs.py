"""spdl_client.Loader iterated like torch's DataLoader, against a real spdld: one epoch per iter(),
set_epoch, early breaks, state_dict across epochs, dict configs, device from LOCAL_RANK, classes,
the IterableDataset adapter, and the examples' epoch loop (set_epoch, break, checkpoint/resume)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import spdl_client
from conftest import BUILD, CLASSES, PER_CLASS, REPO, job_yaml, subprocess_env

N = CLASSES * PER_CLASS  # 48 images
SPDLCTL = BUILD / "bin" / "spdlctl"


def epoch_paths(loader) -> list:
    """One iter(loader): the paths of each batch, checking each batch's epoch and position."""
    it = iter(loader)
    out = []
    for i, b in enumerate(it):
        assert (b.epoch, b.batch_in_epoch) == (it.epoch, i + it.start)
        out.append(list(b.paths))
    return out


def daemon_jobs(socket: str) -> list:
    out = subprocess.run([str(SPDLCTL), "--socket", socket, "--json", "jobs"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    return [dict(j, job_id=int(j["job_id"])) for j in json.loads(out).get("jobs", [])]  # uint64: JSON strings


def test_two_loops_give_epochs_0_and_1_with_len_batches_each(make_loader):
    loader = make_loader(batch=8)  # epochs=None: as many as iterated
    assert loader.epochs is None and len(loader) == N // 8
    for epoch in range(2):
        it = iter(loader)
        assert (it.epoch, len(it)) == (epoch, len(loader))
        got = []
        for batch in it:
            got.append((batch.epoch, batch.batch_in_epoch))
            assert len(it) == len(loader) - len(got)
        assert got == [(epoch, b) for b in range(len(loader))]
        assert loader.epoch_summaries[-1]["epoch"] == epoch
    assert not loader.finished  # the job keeps running for the next epoch
    assert loader.epoch == 2


def test_bounded_epochs_end_the_job_after_the_last(make_loader):
    loader = make_loader(batch=16, epochs=2)
    assert [len(epoch_paths(loader)) for _ in range(2)] == [3, 3]
    assert loader.finished and loader.stats()["batches"] == 6
    with pytest.raises(spdl_client.SpdlError, match="past the job's epochs=2"):
        iter(loader)


def test_set_epoch_3_equals_a_separate_runs_epoch_3(make_loader):
    straight = make_loader(batch=8)
    epochs = [epoch_paths(straight) for _ in range(4)]
    jumped = make_loader(batch=8)
    jumped.set_epoch(3)
    assert epoch_paths(jumped) == epochs[3]
    assert epochs[3] != epochs[2]  # a new order every epoch: the test can tell them apart
    # After the jump the loader goes on with epoch 4; a jump of one epoch ahead drops a few batches.
    assert jumped.epoch == 4
    jumped.set_epoch(5)
    assert len(epoch_paths(jumped)) == len(jumped) and jumped.epoch == 6


def test_set_epoch_in_the_usual_loop_and_going_back_is_refused(make_loader):
    loader = make_loader(batch=16, epochs=3)
    for epoch in range(3):
        loader.set_epoch(epoch)  # the epoch the next iter() yields anyway: a no-op
        assert {b.epoch for b in loader} == {epoch}
    loader = make_loader(batch=16, epochs=3)
    epoch_paths(loader)
    with pytest.raises(ValueError, match="going back is not supported"):
        loader.set_epoch(0)
    with pytest.raises(ValueError, match="epochs=3"):
        loader.set_epoch(3)
    with pytest.raises(ValueError):
        loader.set_epoch(-1)
    loader.set_epoch(1)  # still fine: it is the next one
    assert {b.epoch for b in loader} == {1}


@pytest.mark.parametrize("keep", [1, 5])  # 1: most of the epoch left (reopened); 5: one batch left (drained)
def test_breaking_out_early_drops_the_rest_of_the_epoch(make_loader, daemon, keep):
    reference = make_loader(batch=8)
    ref = [epoch_paths(reference) for _ in range(2)]
    reference.close()
    loader = make_loader(batch=8, prefetch=2)
    first_job = loader.info["job_id"]
    for i, batch in enumerate(loader):
        if i + 1 == keep:
            break
    assert batch.batch_in_epoch == keep - 1 and batch.paths == ref[0][keep - 1]
    del batch
    assert loader.held_batches == 0
    assert epoch_paths(loader) == ref[1]  # epoch 1 from its first batch, in the same order
    assert loader.held_batches == 0
    # Most of the epoch left: the job was reopened at epoch 1 and the abandoned one is gone from the
    # daemon; one batch left: it was read and dropped, and the job goes on.
    if keep == 1:
        assert loader.info["job_id"] != first_job
        deadline = time.monotonic() + 10
        while first_job in {j["job_id"] for j in daemon_jobs(daemon.socket)}:
            assert time.monotonic() < deadline, "the abandoned job is still on the daemon"
            time.sleep(0.05)
    else:
        assert loader.info["job_id"] == first_job
    assert loader.info["job_id"] in {j["job_id"] for j in daemon_jobs(daemon.socket)}


def test_a_new_iter_ends_the_previous_iterator(make_loader):
    loader = make_loader(batch=8)
    first = iter(loader)
    next(first)
    second = iter(loader)
    assert second.epoch == 1
    with pytest.raises(spdl_client.SpdlError, match="no longer the loader's") as err:
        next(first)
    assert err.value.code == "FAILED_PRECONDITION"
    assert next(second).epoch == 1


def test_state_dict_like_statefuldataloader(make_loader):
    """Save in the middle of epoch 1 and at the end of epoch 1; a new loader resumes each exactly."""
    ref_loader = make_loader(batch=8, epochs=3)
    ref = [epoch_paths(ref_loader) for _ in range(3)]
    loader = make_loader(batch=8, epochs=3)
    saved = {}
    for epoch in range(2):
        loader.set_epoch(epoch)
        for i, batch in enumerate(loader):
            if epoch == 1 and i == 2:
                saved["mid"] = json.loads(json.dumps(loader.state_dict()))
        saved[f"end{epoch}"] = loader.state_dict()
    assert (saved["mid"]["epoch"], saved["mid"]["batch_in_epoch"]) == (1, 3)
    assert (saved["end1"]["epoch"], saved["end1"]["batch_in_epoch"], saved["end1"]["resume_token"]) == (2, 0, None)
    loader.close()

    mid = make_loader(batch=8, epochs=3)
    mid.load_state_dict(saved["mid"])
    assert mid.epoch == 1
    got = []
    for epoch in range(saved["mid"]["epoch"], 3):
        mid.set_epoch(epoch)  # a no-op for the resumed epoch: it keeps its mid-epoch start
        got.append(epoch_paths(mid))
    assert got == [ref[1][3:], ref[2]]
    assert mid.finished and mid.stats()["batches"] == 3 + 6  # what the resumed job delivered
    assert mid.state_dict()["batches_seen"] == 18  # the count goes on from the checkpoint's 9

    end = make_loader(batch=8, epochs=3)
    end.load_state_dict(saved["end1"])
    assert epoch_paths(end) == ref[2] and end.finished


def test_a_dict_config(make_loader, dataset):
    config = {
        "source": {"type": "image_folder", "root": dataset.root},  # a Path is fine
        "sampler": {"shuffle": False},
        "batch": {"size": 12},
        "transforms": [{"resize": {"shorter": 40}}, {"center_crop": {"size": 32}}],
    }
    loader = make_loader(config)
    assert loader.config_name == "<dict>"
    assert next(iter(loader))["image"].shape == (12, 32, 32, 3)
    bad = dict(config, batch={"size": -3})
    with pytest.raises(spdl_client.SpdlError, match="batch.size") as err:
        make_loader(bad)
    assert err.value.code == "INVALID_ARGUMENT"
    with pytest.raises(TypeError, match="config dict"):
        make_loader(dict(config, prefetch=object()))


def test_classes_dataset_size_and_a_source_without_classes(make_loader, dataset, daemon, tmp_path_factory):
    loader = make_loader(batch=8)
    assert loader.classes == sorted({f.split("/")[0] for f in dataset.files})
    assert loader.dataset_size == N and loader.info["classes"] == loader.classes
    lst = daemon.tmp / "list.txt"
    lst.write_text("".join(f"{f},{dataset.label_of[f]}\n" for f in dataset.files[:10]))
    config = {"source": {"type": "file_list", "list": str(lst), "root": str(dataset.root)}, "batch": {"size": 5},
              "transforms": [{"resize": {"shorter": 40}}, {"center_crop": {"size": 32}}]}
    listed = make_loader(config)
    assert listed.classes is None and listed.dataset_size == 10 and len(listed) == 2


def test_local_rank_picks_the_gpu_of_a_cuda_job(make_loader, monkeypatch):
    from spdl_client._loader import _resolve_device

    cuda_yaml = "source: {root: /x}\noutput: {device: cuda:0}\n"
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert _resolve_device(None, [], cuda_yaml, None) is None  # the config's own device
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert _resolve_device(None, [], cuda_yaml, None) == "cuda:3"
    assert _resolve_device(None, [], "source: {root: /x}\noutput: {device: cuda}\n", None) == "cuda:3"
    assert _resolve_device(None, [], "source: {root: /x}\n", None) is None  # a CPU job stays one
    assert _resolve_device(None, [], "", {"output": {"device": "cuda"}}) == "cuda:3"  # a dict config
    assert _resolve_device(None, [("output.device", "cuda:1")], cuda_yaml, None) is None  # an override wins
    assert _resolve_device(1, [], cuda_yaml, None) == "cuda:1"
    assert _resolve_device("cpu", [], cuda_yaml, None) == "cpu"
    class TorchDevice:  # what str(torch.device("cuda", 2)) gives
        def __str__(self) -> str:
            return "cuda:2"

    assert _resolve_device(TorchDevice(), [], cuda_yaml, None) == "cuda:2"
    with pytest.raises(ValueError, match="device"):
        _resolve_device("tpu", [], cuda_yaml, None)
    # Through the daemon: LOCAL_RANK leaves a CPU job alone; device= reaches the daemon.
    assert make_loader(batch=8).device == "cpu"
    monkeypatch.delenv("LOCAL_RANK")
    with pytest.raises(spdl_client.SpdlError, match="cuda:7"):
        make_loader(batch=8, device=7)


def test_as_dataset_feeds_a_torch_dataloader(make_loader):
    torch = pytest.importorskip("torch", reason="the adapter is torch's IterableDataset; torch is not installed here")
    loader = make_loader(batch=8, prefetch=3)
    ref = make_loader(batch=8)
    ref_epochs = [[b.labels for b in ref] for _ in range(2)]
    ds = loader.as_dataset()
    assert isinstance(ds, torch.utils.data.IterableDataset) and len(ds) == len(loader)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    for epoch in range(2):
        ds.set_epoch(epoch)
        labels = []
        for batch in dl:
            assert set(batch) == {"image", "label"} and batch["image"].shape == (8, 56, 56, 3)
            labels.append(batch["label"].tolist())
        assert labels == ref_epochs[epoch]
    del batch
    assert loader.held_batches == 0
    it = iter(torch.utils.data.DataLoader(loader.as_dataset(), batch_size=None, num_workers=1))
    with pytest.raises(RuntimeError, match="num_workers=0"):
        next(it)
    # The forked worker holds a copy of the loader's connection until torch shuts it down.
    it._shutdown_workers()
    del it


# ---- the examples ----

EXAMPLE = REPO / "client/python/examples/epochs.py"


def run_example(daemon, dataset, tmp_path, *args, env=None):
    cmd = [sys.executable, str(EXAMPLE), "--data", str(dataset.root), "--socket", daemon.socket,
           "--checkpoint", str(tmp_path / "ck.pt"), "--record", str(tmp_path / "record.jsonl"),
           "--set", "batch.size=8", *args]
    proc = subprocess.run(cmd, env=subprocess_env(**(env or {"RANK": 0, "WORLD_SIZE": 1})), capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def records(path) -> list:
    out = [json.loads(line) for line in open(path)]
    path.unlink()
    return [(r["epoch"], r["batch"], tuple(r["paths"])) for r in out]


def test_example_epoch_loop_early_break_and_resume(daemon, dataset, tmp_path):
    pytest.importorskip("torch", reason="the example trains with torch; torch is not installed here")
    rec = tmp_path / "record.jsonl"
    run_example(daemon, dataset, tmp_path, "--epochs", "3")
    full = records(rec)
    assert [(e, b) for e, b, _ in full] == [(e, b) for e in range(3) for b in range(6)]
    # An early break in every epoch: each epoch starts at its first batch, in the same order.
    run_example(daemon, dataset, tmp_path, "--epochs", "3", "--max-batches-per-epoch", "2")
    assert records(rec) == [r for r in full if r[1] < 2]
    # Preempted mid-epoch (step 8 = batch 1 of epoch 1), then resumed: the same batches, in order.
    out = run_example(daemon, dataset, tmp_path, "--epochs", "3", "--stop-after", "8")
    assert "stopped after 8 steps (epoch 1)" in out
    run_example(daemon, dataset, tmp_path, "--epochs", "3", "--resume")
    assert records(rec) == full
    # Preempted at an epoch boundary (step 12 = the last batch of epoch 1), then resumed.
    run_example(daemon, dataset, tmp_path, "--epochs", "3", "--stop-after", "12")
    run_example(daemon, dataset, tmp_path, "--epochs", "3", "--resume")
    assert records(rec) == full


def test_dropping_the_loader_ends_its_job_without_a_garbage_collection(daemon, dataset):
    import gc

    gc.disable()  # only reference counting: no cycle may keep the loader (and its job) alive
    try:
        loader = spdl_client.Loader(job_yaml(dataset.root, batch=8), socket=daemon.socket, rank=0, world_size=1)
        job = loader.info["job_id"]
        epoch_paths(loader)
        for batch in loader:  # a break out of epoch 1: the iterator stays unfinished
            break
        del batch
        assert job in {j["job_id"] for j in daemon_jobs(daemon.socket)}
        del loader
        deadline = time.monotonic() + 10
        while job in {j["job_id"] for j in daemon_jobs(daemon.socket)}:
            assert time.monotonic() < deadline, "the dropped loader's job is still on the daemon"
            time.sleep(0.05)
    finally:
        gc.enable()
