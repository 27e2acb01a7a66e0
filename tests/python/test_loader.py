"""spdl_client.Loader against a real spdld: what it yields, in which order, and how it is opened."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import spdl_client
from conftest import CLASSES, PER_CLASS, REPO, SMALL

N = CLASSES * PER_CLASS  # 48 images


def test_iterates_one_job_and_reports_its_stats(make_loader):
    loader = make_loader(batch=8, epochs=2)
    assert len(loader) == N // 8
    info = loader.info
    assert info["batch_size"] == 8 and info["dataset_size"] == N and info["samples_per_epoch"] == N
    assert info["num_slots"] == 2
    assert [(t["name"], t["dtype"], t["shape"]) for t in info["layout"]] == [
        ("image", "uint8", (8, 56, 56, 3)),
        ("label", "int64", (8,)),
    ]
    seen = []
    for epoch in range(2):
        for batch in loader:
            assert set(batch) == {"image", "label"} and len(batch) == 2
            image, label = batch["image"], batch["label"]
            assert (image.shape, image.dtype, label.shape, label.dtype) == ((8, 56, 56, 3), "uint8", (8,), "int64")
            assert batch.rows == 8 and len(batch.paths) == 8 and len(batch.labels) == 8
            seen.append((batch.epoch, batch.batch_in_epoch))
            assert loader.stats()["finished"] is False
    assert seen == [(e, b) for e in range(2) for b in range(N // 8)]
    assert loader.finished
    # Past its epochs the loader says so (a silent empty epoch would hide a wrong epoch count).
    with pytest.raises(spdl_client.SpdlError, match="past the job's epochs=2") as err:
        iter(loader)
    assert err.value.code == "FAILED_PRECONDITION"

    stats = loader.stats()
    assert stats["finished"] is True
    assert (stats["batches"], stats["samples"], stats["skipped"]) == (2 * N // 8, 2 * N, 0)
    assert stats["seconds"] > 0 and stats["first_batch_seconds"] >= 0
    assert {s["name"] for s in stats["stages"]} >= {"decode"}
    assert [(e["epoch"], e["batches"], e["samples"]) for e in loader.epoch_summaries] == [(0, 6, N), (1, 6, N)]
    assert stats["epochs"] == loader.epoch_summaries


def test_stats_before_the_end_count_what_was_yielded(make_loader):
    loader = make_loader(batch=8, epochs=1)
    it = iter(loader)
    next(it)
    next(it)
    stats = loader.stats()
    assert stats["finished"] is False
    assert (stats["batches"], stats["samples"], stats["seconds"], stats["stages"]) == (2, 16, None, None)


def test_labels_match_class_folders(make_loader, dataset):
    loader = make_loader(batch=7, epochs=1)  # 48 = 6 * 7 + 6: the last batch is partial
    rows = []
    for batch in loader:
        labels = np.from_dlpack(batch["label"])
        assert labels.tolist() == batch.labels
        assert batch["image"].shape[0] == batch.rows == len(batch.paths)
        for path, label in zip(batch.paths, batch.labels):
            assert dataset.label_of[path] == label, path
        rows.append(batch.rows)
    assert rows == [7] * 6 + [6]
    assert len(loader) == 7


def test_exact_epoch_coverage_over_two_ranks(make_loader, dataset):
    epochs = 2
    per_rank = []
    for rank in range(2):
        loader = make_loader(batch=5, epochs=epochs, rank=rank, world_size=2)
        assert len(loader) == 5  # 24 samples per rank in batches of 5: 4 full + 1 of 4
        order = [[] for _ in range(epochs)]
        for epoch in range(epochs):
            for batch in loader:
                order[batch.epoch].extend(batch.paths)
        per_rank.append(order)
    for e in range(epochs):
        both = per_rank[0][e] + per_rank[1][e]
        assert len(per_rank[0][e]) == len(per_rank[1][e]) == N // 2
        assert Counter(both) == Counter(dataset.files), f"epoch {e}: not every file exactly once"
    # Shuffled: a new order every epoch (the same on every rank).
    assert per_rank[0][0] != per_rank[0][1]


def test_order_is_reproducible(make_loader):
    def paths(**kw):
        return [p for b in make_loader(batch=8, **kw) for p in b.paths]

    assert paths(seed=3) == paths(seed=3)
    assert paths(seed=3) != paths(seed=4)


def test_endless_job_runs_until_closed(make_loader, daemon):
    loader = make_loader(batch=16, epochs=0)
    assert loader.epochs is None  # 0 is the daemon's "until ended", as None
    for epoch in range(3):
        assert [b.epoch for b in loader] == [epoch] * len(loader)
    it = iter(loader)
    assert next(it).epoch == 3  # into a 4th epoch
    assert len(loader.epoch_summaries) == 3
    loader.close()
    assert loader.closed
    with pytest.raises(spdl_client.SpdlError) as err:
        next(it)
    assert err.value.code == "FAILED_PRECONDITION"
    # Closing ended that job; the daemon serves the next one.
    assert next(iter(make_loader(batch=16))).rows == 16


def test_end_stops_the_job_early(make_loader):
    loader = make_loader(batch=4, epochs=0)
    it = iter(loader)
    first = next(it)
    del first
    loader.end()  # waits for the daemon's stats (or its closing the connection)
    assert loader.finished
    with pytest.raises(spdl_client.SpdlError, match="no longer the loader's"):
        next(it)
    with pytest.raises(spdl_client.SpdlError, match="has ended"):
        iter(loader)
    assert loader.held_batches == 0


def test_context_manager_closes(make_loader, dataset, daemon):
    with spdl_client.Loader(
        REPO / "config" / "examples" / "imagenet.yaml",  # a path (PathLike) to a YAML file
        socket=daemon.socket,
        overrides={"source.root": dataset.root, "batch.size": 16, **SMALL},
    ) as loader:
        assert loader.config_name.endswith("imagenet.yaml")
        batch = next(iter(loader))
        assert batch["image"].shape == (16, 56, 56, 3)
    assert loader.closed
    # A batch may outlive its loader: its memory stays mapped and readable.
    assert np.from_dlpack(batch["image"]).sum() >= 0


def test_state_dict_tracks_the_position(make_loader):
    loader = make_loader(batch=8, epochs=2)
    state = loader.state_dict()
    assert (state["epoch"], state["batch_in_epoch"], state["batches_seen"]) == (0, 0, 0)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["batch_in_epoch"], state["batches_seen"], state["samples_seen"]) == (0, 4, 4, 32)
    assert isinstance(state["resume_token"], str)  # mid-epoch: the daemon's token
    for _ in range(2):
        next(it)  # the epoch's last batch
    state = loader.state_dict()
    assert (state["epoch"], state["batch_in_epoch"]) == (1, 0)
    assert (state["batches_per_epoch"], state["batch_size"], state["dataset_size"]) == (6, 8, N)
    assert (state["rank"], state["world_size"], state["epochs"]) == (0, 1, 2)
    assert state["resume_token"] is None  # an epoch's start needs none
    # Plain values: it survives JSON (and so torch.save) unchanged.
    assert json.loads(json.dumps(state)) == state
    assert make_loader(batch=8).state_dict()["resume_token"] is None


def _run(loader, stop=None) -> list:
    """The paths of each batch of the loader's remaining epochs (one iter() per epoch), stopping
    after `stop` batches (a break out of the epoch's loop)."""
    seen = []
    while loader.epoch < loader.epochs:
        for b in loader:
            seen.append(list(b.paths))
            if len(seen) == stop:
                return seen
    return seen


@pytest.mark.parametrize("stop", [1, 4, 6, 9])
def test_load_state_dict_continues_exactly_where_it_stopped(make_loader, stop):
    full = _run(make_loader(batch=8, epochs=2))
    assert len(full) == 12
    first = make_loader(batch=8, epochs=2)
    seen = _run(first, stop)
    state = json.loads(json.dumps(first.state_dict()))
    assert (state["epoch"], state["batch_in_epoch"]) == divmod(stop, 6)
    first.close()
    resumed = make_loader(batch=8, epochs=2)
    resumed.load_state_dict(state)
    rest = _run(resumed)
    assert seen + rest == full
    assert resumed.state_dict()["batches_seen"] == len(full)


def test_load_state_dict_refuses_another_job(make_loader):
    a = make_loader(batch=8, epochs=1)
    next(iter(a))
    state = a.state_dict()
    with pytest.raises(spdl_client.SpdlError, match="another job"):
        make_loader(batch=8, epochs=1, seed=99).load_state_dict(state)
    with pytest.raises(ValueError, match="rank"):
        b = make_loader(batch=8, rank=1, world_size=2)
        b.load_state_dict(state)


def test_defaults_come_from_the_environment(make_loader, daemon, dataset, monkeypatch):
    monkeypatch.setenv("SPDLD_SOCKET", daemon.socket)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = make_loader(socket=None, rank=None, world_size=None, epochs=None, batch=4)
    assert (loader.socket, loader.rank, loader.world_size, loader.epochs) == (daemon.socket, 1, 3, None)
    assert loader.info["samples_per_epoch"] == N // 3
    assert sum(1 for _ in loader) == len(loader) == N // 3 // 4  # (list(loader) would hold every slot)

    monkeypatch.delenv("SPDLD_SOCKET")
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    from spdl_client import _loader

    assert _loader._resolve_socket(None) == spdl_client.DEFAULT_SOCKET == "/run/spdld/spdld.sock"
    assert _loader._resolve_rank(None, None) == (0, 1)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK"):
        _loader._resolve_rank(None, None)


def test_config_file_text_and_overrides(make_loader, dataset, daemon, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(f"source: {{root: {dataset.root}}}\ntransforms:\n  - resize: {{shorter: 40}}\n  - center_crop: {{size: 32}}\n")
    # A str that names an existing file is read as a file.
    loader = make_loader(str(path), overrides=["batch.size=12", "prefetch=3"])
    assert loader.config_name == str(path)
    assert (loader.info["batch_size"], loader.info["num_slots"]) == (12, 3)
    assert next(iter(loader))["image"].shape == (12, 32, 32, 3)
    # Override values may be Python values: numbers, booleans, lists.
    loader = make_loader(path, overrides={"batch.size": 6, "batch.drop_last": True, "source.extensions": [".jpg"]})
    assert loader.info["batch_size"] == 6 and len(loader) == N // 6
    # (key, value) pairs work too.
    assert make_loader(path, overrides=[("batch.size", "24")]).info["batch_size"] == 24


def test_final_stats_carry_every_stage_figure_and_the_cache(make_loader):
    loader = make_loader(batch=8, epochs=1)
    for _ in loader:
        pass
    stats = loader.stats()
    assert stats["finished"] is True and stats["client_wait_seconds"] >= 0
    kinds = {s["name"]: s["kind"] for s in stats["stages"]}
    assert kinds["decode"] == "cpu" and kinds.get("read", "io") == "io"
    for s in stats["stages"]:
        assert 0 <= s["p50_ms"] <= s["p90_ms"] <= s["p99_ms"]
        assert s["avg_ms"] >= 0 and s["items_per_s"] >= 0
        assert s["put_wait_seconds"] >= 0 and s["get_wait_seconds"] >= 0
    assert set(stats["cache"]) == {"hits", "misses", "evictions", "bytes", "budget_bytes"}
    assert stats["cache"]["budget_bytes"] == 0  # this daemon has no cache_bytes
    assert loader.stats()["cache"] is not None


def test_final_stats_values_carry_every_figure_described_for_clients(make_loader):
    # stats()["values"] is filled by name from the daemon's one description of the job statistics
    # (proto/job_stats_fields.h; stats_fields_test checks every field reaches it).
    loader = make_loader(batch=8, epochs=1)
    for _ in loader:
        pass
    stats = loader.stats()
    values = stats["values"]
    for name in ("samples", "batches", "skipped", "seconds", "first_batch_seconds", "client_wait_seconds",
                 "samples_tried", "samples_failed", "samples_per_s", "weight", "cache_hits",
                 "share_members", "share_group_job_id"):
        assert name in values, name
    assert values["samples"] == stats["samples"] and isinstance(values["samples"], int)
    assert values["samples_tried"] >= values["samples"] and values["weight"] >= 1
    assert values["client_wait_seconds"] == stats["client_wait_seconds"]
    assert "batches_ready" not in values  # a live figure, 0 at the end: not described for clients


def test_final_stats_follow_the_one_description_of_every_figure(make_loader):
    # The job's `values` and every stage dict are filled by name from the daemon's tables
    # (proto/job_stats_fields.h, listed by stat_fields()): each row described for clients is there,
    # in the daemon's order (counts as int), and no other figure is.
    tables = spdl_client._spdl_client.stat_fields()
    assert set(tables) == {"job", "stage", "daemon", "job_summary", "stream", "stream_group", "gpu_device"}
    for table, rows in tables.items():
        assert rows, table
        for r in rows:
            assert set(r) == {"name", "metric", "type", "unit", "help", "surfaces", "per", "column"}
            assert set(r["surfaces"]) <= {"metrics", "spdlctl", "client", "text"} and r["surfaces"], r
            assert (r["column"] is not None) == ("text" in r["surfaces"]), r
            assert ("metrics" in r["surfaces"]) == bool(r["metric"]), r
    for table in ("daemon", "job_summary", "stream", "stream_group", "gpu_device"):
        assert not any("client" in r["surfaces"] for r in tables[table]), table
    # Metric names are an interface: the stream and GPU series keep theirs.
    assert {r["metric"] for r in tables["stream"] if r["metric"]} >= {
        "spdld_stream_retained_samples", "spdld_stream_put_samples_total", "spdld_stream_blocked_puts_total"}
    assert [r["metric"] for r in tables["gpu_device"] if r["metric"]] == ["spdld_gpu_device_poisoned"]
    loader = make_loader(batch=8, epochs=1)
    for _ in loader:
        pass
    stats = loader.stats()
    job_rows = [r for r in tables["job"] if "client" in r["surfaces"] and r["per"] is None]
    assert list(stats["values"]) == [r["name"] for r in job_rows]  # one source: no source_samples.N
    stage_rows = [r for r in tables["stage"] if "client" in r["surfaces"]]
    assert {"tasks", "avg_ms", "window_items_per_s", "concurrency"} <= {r["name"] for r in stage_rows}
    assert stats["stages"]
    for s in stats["stages"]:
        assert list(s) == ["name", "kind"] + [r["name"] for r in stage_rows], s
        assert all(isinstance(s[r["name"]], (int, float)) for r in stage_rows)
        assert isinstance(s["tasks"], int) and isinstance(s["window_tasks"], int) and isinstance(s["avg_ms"], float)
    decode = next(s for s in stats["stages"] if s["name"] == "decode")
    assert decode["tasks"] >= N and decode["window_tasks"] <= decode["tasks"]
