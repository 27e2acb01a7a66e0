"""Streams (issue 21) through the real daemon: a producer pushing real JPEGs, stream jobs in consumer
groups (each sample to one consumer of a group, every group sees all), backpressure at the stream's
bound with the daemon's memory measured, a consumer SIGKILLed mid-stream and a new one resuming from
its token, garbage bytes skipped per on_error, and the stream ACL."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import spdl_client
from conftest import BUILD, subprocess_env

N_JPEGS = 2000


def _jpeg(i: int, side: int = 24) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(i)
    img = Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8))
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=80)
    return out.getvalue()


@pytest.fixture(scope="module")
def jpegs() -> list:
    return [_jpeg(i) for i in range(N_JPEGS)]


def stream_yaml(name: str, group: str = "g", *, batch: int = 16, prefetch: int = 2, extra: str = "",
                source_extra: str = "") -> str:
    return (
        f"source: {{type: stream, name: {name}, group: {group}{source_extra}}}\n"
        f"batch: {{size: {batch}}}\n"
        "transforms:\n"
        "  - resize: {shorter: 16}\n"
        "  - center_crop: {size: 16}\n"
        f"prefetch: {prefetch}\n"
        f"{extra}"
    )


def consume(loader, out: list, errors: list) -> None:
    """Every label the loader delivers, appended to out (one epoch: until the stream ends)."""
    try:
        for batch in loader:
            labels = np.from_dlpack(batch["label"]).copy()
            assert len(labels) == batch.rows
            out.extend(int(x) for x in labels)
            del batch
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


def open_loader(daemon, yaml_text: str, **kw):
    kw.setdefault("timeout", 30)
    return spdl_client.Loader(yaml_text, socket=daemon.socket, rank=0, world_size=1, epochs=1, **kw)


def spdlctl_streams(daemon) -> dict:
    out = subprocess.run([str(BUILD / "bin" / "spdlctl"), "--socket", daemon.socket, "--json", "streams"],
                         check=True, capture_output=True, text=True).stdout
    return {s["name"]: s for s in json.loads(out).get("streams", [])}


def spdlctl_streams_text(daemon, name: str) -> dict:
    """`spdlctl streams` (the text for people) as {column header: cell} for stream `name`'s row."""
    out = subprocess.run([str(BUILD / "bin" / "spdlctl"), "--socket", daemon.socket, "streams"],
                         check=True, capture_output=True, text=True).stdout
    lines = out.splitlines()
    header = lines[0].split()
    row = next(line.split() for line in lines[1:] if line.split()[:1] == [name])
    assert len(row) == len(header), (header, row)
    return dict(zip(header, row))


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_one_group_two_consumers_each_sample_once(daemon, jpegs):
    name = "one-group"
    producer = spdl_client.Producer(name, socket=daemon.socket, max_samples=4096)
    loaders = [open_loader(daemon, stream_yaml(name, "g")) for _ in range(2)]
    got = [[], []]
    errors: list = []
    threads = [threading.Thread(target=consume, args=(ld, got[i], errors)) for i, ld in enumerate(loaders)]
    for t in threads:
        t.start()
    offsets = [producer.put(data, label=i) for i, data in enumerate(jpegs)]
    assert offsets == list(range(offsets[0], offsets[0] + N_JPEGS))
    producer.close(end_stream=True)
    for t in threads:
        t.join(60)
    assert not errors, errors
    everything = got[0] + got[1]
    assert sorted(everything) == list(range(N_JPEGS)), "each sample exactly once across the group"
    assert got[0] and got[1], f"both consumers of the group took a share ({len(got[0])}, {len(got[1])})"
    print(f"group of two: {len(got[0])} + {len(got[1])} samples")
    for ld in loaders:
        ld.close()


def consume_with_metadata(loader, out: list, errors: list) -> None:
    """As consume, checking that each row's metadata is the one its producer put with its label."""
    try:
        for batch in loader:
            labels = [int(x) for x in np.from_dlpack(batch["label"])]
            assert batch.metadata == [b"m%d" % x for x in labels], (batch.metadata, labels)
            assert len(batch.offsets) == batch.rows
            out.extend(labels)
            del batch
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


def test_two_groups_each_receive_all_and_garbage_is_skipped(daemon, jpegs):
    name = "two-groups"
    n = 500
    producer = spdl_client.Producer(name, socket=daemon.socket, max_samples=4096)
    loaders = [open_loader(daemon, stream_yaml(name, g, batch=8)) for g in ("a", "b")]
    got = [[], []]
    errors: list = []
    threads = [threading.Thread(target=consume_with_metadata, args=(ld, got[i], errors))
               for i, ld in enumerate(loaders)]
    for t in threads:
        t.start()
    for i in range(n):
        producer.put(jpegs[i], label=i, metadata=b"m%d" % i)
        if i == 100:
            producer.put(b"this is no image at all", label=-7, key="garbage")  # on_error: skip (the default)
    producer.close(end_stream=True)
    for t in threads:
        t.join(60)
    assert not errors, errors
    for g in got:
        assert sorted(g) == list(range(n)), "every group sees every sample (the garbage one skipped)"
    for ld in loaders:
        stats = ld.stats()
        assert stats["skipped"] == 1, stats
        ld.close()


def test_backpressure_blocks_at_the_bound_and_memory_stays_bounded(daemon):
    name = "bounded"
    big = _jpeg(1, side=320)  # a noisy JPEG of about 64 KiB (through the shared put buffer)
    assert len(big) > (32 << 10), len(big)
    bound = 32
    producer = spdl_client.Producer(name, socket=daemon.socket, max_samples=bound, max_bytes=64 << 20)
    for i in range(bound):
        producer.put(big, label=i, block=False)
    with pytest.raises(spdl_client.SpdlError) as e:
        producer.put(big, label=bound, block=False)
    assert e.value.code == "RESOURCE_EXHAUSTED" and "max_samples 32" in str(e.value)
    # A blocking put waits at the bound (nobody consumes yet).
    done = threading.Event()
    result: list = []
    t = threading.Thread(target=lambda: (result.append(producer.put(big, label=bound)), done.set()))
    t.start()
    assert not done.wait(0.5), "a put into a full stream must block"
    s = spdlctl_streams(daemon)[name]
    assert int(s["retained_samples"]) == bound and int(s["blocked_puts"]) >= 2, s
    # The text shows, in its column, every stream figure described for it (stat_fields(): "text"),
    # the same as --json while the put waits (nothing moves).
    text = spdlctl_streams_text(daemon, name)
    rows = [r for r in spdl_client._spdl_client.stat_fields()["stream"] if "text" in r["surfaces"]]
    assert [r["column"] for r in rows] == list(text)[1:], text
    for r in rows:
        want = s[r["name"]]
        want = ("yes" if want else "no") if isinstance(want, bool) else str(int(want))
        assert text[r["column"]] == want, (r["name"], text, s)
    # A consumer frees room: the blocked put goes in, and a long run of puts keeps the daemon's
    # memory bounded.
    loader = open_loader(daemon, stream_yaml(name, "drain", batch=8), timeout=60)
    errors: list = []
    sink: list = []
    th = threading.Thread(target=consume, args=(loader, sink, errors))
    th.start()
    assert done.wait(20), "the blocked put never went in"
    rss_before = rss_bytes(daemon.proc.pid)
    total = 2000  # over 64 MiB through a stream that holds at most 32 samples
    for i in range(total):
        producer.put(big, label=i)
    rss_after = rss_bytes(daemon.proc.pid)
    s = spdlctl_streams(daemon)[name]
    producer.close(end_stream=True)
    th.join(60)
    grew = rss_after - rss_before
    print(f"backpressure: {total} x {len(big) >> 10} KiB put through a {bound}-sample stream: RSS grew {grew >> 20} MiB "
          f"({rss_before >> 20} -> {rss_after >> 20} MiB), retained {s['retained_bytes']} bytes")
    assert int(s["retained_samples"]) <= bound
    assert grew < (32 << 20), f"the daemon grew {grew >> 20} MiB while {total * len(big) >> 20} MiB went through"
    loader.close()


CHILD = r"""
import json, sys, time
import numpy as np
import spdl_client
loader = spdl_client.Loader(sys.argv[2], socket=sys.argv[1], rank=0, world_size=1, epochs=1, timeout=60)
for batch in loader:
    labels = [int(x) for x in np.from_dlpack(batch["label"])]
    print(json.dumps({"labels": labels, "state": loader.state_dict()}), flush=True)
    del batch
    time.sleep(0.02)
"""


def test_sigkilled_consumer_resumes_from_its_token(daemon, jpegs):
    name = "killed"
    n = 600
    batch, prefetch = 8, 3
    yaml_text = stream_yaml(name, "g", batch=batch, prefetch=prefetch)
    producer = spdl_client.Producer(name, socket=daemon.socket, max_samples=4096)
    for i in range(n):
        producer.put(jpegs[i], label=i)
    child = subprocess.Popen([sys.executable, "-c", CHILD, daemon.socket, yaml_text], stdout=subprocess.PIPE,
                             env=subprocess_env(), text=True)
    lines = []
    while len(lines) < 10:
        line = child.stdout.readline()
        assert line, f"the consumer ended early (exit {child.poll()})"
        lines.append(json.loads(line))
    child.send_signal(signal.SIGKILL)
    child.wait()
    # What the killed consumer may still have printed before it died.
    lines += [json.loads(x) for x in child.stdout.read().splitlines() if x.strip()]
    seen_by_child = [x for line in lines for x in line["labels"]]
    state = lines[-1]["state"]
    producer.close(end_stream=True)

    loader = open_loader(daemon, yaml_text)
    loader.load_state_dict(state)
    rest: list = []
    errors: list = []
    consume(loader, rest, errors)
    assert not errors, errors
    loader.close()
    everything = seen_by_child + rest
    missed = set(range(n)) - set(everything)
    assert not missed, f"{len(missed)} samples missed after the resume"
    dups = sorted(x for x in set(rest) if x in set(seen_by_child))
    # Only samples in flight at the kill come again: those of the child's last unreleased batches.
    in_flight = {x for line in lines[-prefetch:] for x in line["labels"]}
    assert set(dups) <= in_flight, f"duplicated outside the in-flight batches: {sorted(set(dups) - in_flight)}"
    assert len(rest) == len(set(rest)), "the resumed consumer got a sample twice"
    print(f"kill -9: child saw {len(seen_by_child)}, resumed consumer {len(rest)}, {len(dups)} redelivered in flight")


def test_stream_acl_refuses_another_uid(daemon):
    if os.getuid() != 0:
        pytest.skip("needs root to act as a second uid")
    spdl_client.Producer("private", socket=daemon.socket, max_samples=8).close()
    # Let the other uid reach the socket (the test's directories are private to root).
    opened = []
    p = Path(daemon.socket).parent
    while str(p) not in ("/", "/tmp"):
        opened.append((p, p.stat().st_mode & 0o7777))
        p.chmod(p.stat().st_mode | 0o011)
        p = p.parent
    os.chmod(daemon.socket, 0o777)
    code = (
        "import os, sys, spdl_client\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "try:\n"
        "    spdl_client.Producer('private', socket=sys.argv[1])\n"
        "    print('ALLOWED')\n"
        "except spdl_client.SpdlError as e:\n"
        "    print(e.code, str(e))\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code, daemon.socket], capture_output=True, text=True,
                             env=subprocess_env(), timeout=30)
    finally:
        for d, mode in opened:
            d.chmod(mode)
    assert "PERMISSION_DENIED" in out.stdout and "uid 65534" in out.stdout, out.stdout + out.stderr


def test_max_batch_delay_sends_a_partial_batch(daemon, jpegs):
    name = "delayed"
    producer = spdl_client.Producer(name, socket=daemon.socket, max_samples=64)
    loader = open_loader(daemon, stream_yaml(name, "g", batch=16, extra="max_batch_delay_ms: 100\n"))
    for i in range(5):
        producer.put(jpegs[i], label=i)
    it = iter(loader)
    t0 = time.monotonic()
    batch = it.next(timeout=10)
    waited = time.monotonic() - t0
    assert batch is not None and batch.rows == 5, "5 samples, then nothing for 100 ms: a batch of 5 rows"
    assert sorted(int(x) for x in np.from_dlpack(batch["label"])) == list(range(5))
    del batch
    producer.close(end_stream=True)
    assert it.next(timeout=10) is None  # the stream ended: the epoch (and the job) ends
    print(f"max_batch_delay_ms 100: a 5-row batch after {waited * 1e3:.0f} ms")
    loader.close()


def test_put_many_pipelines_puts_in_order_each_once(daemon, jpegs):
    """put_many: small samples inline and large ones through the put buffer, in one call; offsets
    in order and contiguous; the job receives each exactly once with its label and metadata."""
    name = "put-many"
    big = [_jpeg(10_000 + i, side=96) for i in range(20)]  # over 4 KiB: through the put buffer
    assert all(len(b) > 4096 for b in big)
    data = list(jpegs[:300])
    for k, b in enumerate(big):
        data.insert(15 * k + 7, b)
    n = len(data)
    producer = spdl_client.Producer(name, socket=daemon.socket, max_samples=4096)
    loader = open_loader(daemon, stream_yaml(name, "g", batch=8))
    got: list = []
    errors: list = []
    t = threading.Thread(target=consume_with_metadata, args=(loader, got, errors))
    t.start()
    offsets = producer.put_many(data, labels=list(range(n)), metadata=[b"m%d" % i for i in range(n)])
    assert offsets == list(range(offsets[0], offsets[0] + n))
    with pytest.raises(spdl_client.SpdlError, match="2 labels for 3 samples"):
        producer.put_many(data[:3], labels=[0, 1])
    producer.close(end_stream=True)
    t.join(60)
    assert not errors, errors
    assert sorted(got) == list(range(n)), "each sample of the put_many exactly once"
    loader.close()


def _watch_yaml(root: str) -> str:
    return (f"source: {{type: watch, root: {root}, group: g}}\nbatch: {{size: 2}}\nmax_batch_delay_ms: 50\n"
            "transforms:\n  - resize: {shorter: 16}\n  - center_crop: {size: 16}\nprefetch: 2\non_error: fail\n")


def _take_paths(it, want: set, got: list, quiet: float = 0.6, limit: float = 20) -> None:
    """Appends the paths of every batch to `got` until `want` all arrived and then `quiet` seconds
    brought nothing (a duplicate would show)."""
    deadline = time.monotonic() + limit
    done_at = None
    while time.monotonic() < deadline:
        if done_at is None and want <= set(got):
            done_at = time.monotonic()
        if done_at is not None and time.monotonic() - done_at > quiet:
            return
        try:
            batch = it.next(timeout=0.1)
        except spdl_client.SpdlTimeoutError:
            continue
        assert batch is not None, "the watch job ended"
        got.extend(batch.paths)
        del batch


def test_watch_resume_within_retention_misses_nothing_and_repeats_nothing(daemon, jpegs):
    """The rule (README "Watching a folder"): a watch job resumed from its token while its watch
    still runs (a group keeps the watch for group_retention, 60 s, without a consumer) continues the
    group: the files completed while no job ran arrive, each once, and none delivered before again."""
    root = daemon.tmp / "watched-resume"
    (root / "a").mkdir(parents=True)
    for i in range(4):
        (root / "a" / f"first{i}.jpg").write_bytes(jpegs[i])
    yaml_text = _watch_yaml(str(root))
    loader = open_loader(daemon, yaml_text)
    it = iter(loader)
    before: list = []
    _take_paths(it, {f"a/first{i}.jpg" for i in range(4)}, before)
    state = loader.state_dict()
    loader.close()
    # While no job runs: written in place, and renamed into place.
    for i in range(3):
        (root / "a" / f"down{i}.jpg").write_bytes(jpegs[10 + i])
    for i in range(3):
        tmp = root / "a" / f".down-r{i}.tmp"
        tmp.write_bytes(jpegs[20 + i])
        tmp.rename(root / "a" / f"down-r{i}.jpg")
    resumed = open_loader(daemon, yaml_text)
    resumed.load_state_dict(state)
    after: list = []
    want = {f"a/down{i}.jpg" for i in range(3)} | {f"a/down-r{i}.jpg" for i in range(3)}
    _take_paths(iter(resumed), want, after)
    resumed.close()
    assert sorted(before) == sorted(f"a/first{i}.jpg" for i in range(4)), before
    assert sorted(after) == sorted(want), f"after the resume: {sorted(after)}"
