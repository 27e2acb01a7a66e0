"""Streamed s3 tar shards and the node-wide shard cache (daemon config cache_dir), against a real S3
server (moto on 127.0.0.1, signature checks on) behind a counting proxy, and real spdld processes:
with a spdl-shard manifest the first batch comes before the other shards have arrived; with the
cache on, each shard is fetched once per node while 4 ranks read, the cache survives a restart,
stays within its budget, refetches a damaged file, and an unusable cache dir leaves the jobs
streaming with one warning. No test touches an address other than 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

import spdl_client
from conftest import SPDLD, SpdldProcess
from s3_server import BUCKET, Moto, Proxy, dataset_shard, read_head, require_moto, use_trainer_credentials

require_moto()

SHARDS = 4


class CountingProxy(Proxy):
    """An HTTP proxy to moto on 127.0.0.1, one request per connection, that counts per path the GETs
    of whole objects, the 1-byte probes (Range: bytes=0-0) and other ranged GETs, and can hold the
    GETs of some paths until released."""

    def __init__(self, upstream_port: int) -> None:
        self.full: dict = {}
        self.probes: dict = {}
        self.ranged: dict = {}
        self.held: dict = {}  # path -> threading.Event: whole GETs of it wait until set
        super().__init__(upstream_port)

    def reset(self) -> None:
        with self.lock:
            self.full, self.probes, self.ranged = {}, {}, {}

    def handle(self, conn) -> None:
        req = read_head(conn)
        if not req:
            return
        line = req.split(b"\r\n", 1)[0].decode()
        path = line.split(" ")[1].split("?")[0]
        lower = req.lower()
        probe = b"\r\nrange: bytes=0-0" in lower
        ranged = b"\r\nrange:" in lower
        if line.startswith("GET"):
            with self.lock:
                counter = self.probes if probe else self.ranged if ranged else self.full
                counter[path] = counter.get(path, 0) + 1
                hold = None if ranged else self.held.get(path)
            if hold is not None:
                hold.wait(30)
        up = self.upstream()
        up.sendall(req)
        while True:
            chunk = up.recv(65536)
            if not chunk:
                break
            conn.sendall(chunk)
        up.close()

    def close(self) -> None:
        for e in self.held.values():
            e.set()
        super().close()


def start_spdld(tmp: Path, name: str, proxy_url: str, extra: str = "") -> SpdldProcess:
    """A spdld process with the given extra config lines, allowed the proxy's bucket."""
    return SpdldProcess(tmp, name, [f"{proxy_url}/{BUCKET}"], extra=extra)


@pytest.fixture(scope="module")
def store(tmp_root, dataset):
    """(moto, proxy, keys by shard): SHARDS shards under streamed/ with a spdl-shard manifest, and
    the same shards under plain/ without one."""
    moto = Moto(tmp_root)
    proxy = CountingProxy(moto.port)
    per = len(dataset.files) // SHARDS
    manifest = {"format": "spdl-shard", "version": 1, "shards": []}
    keys = []
    for s in range(SHARDS):
        rels = dataset.files[s * per:(s + 1) * per]
        keys.append([rel.rsplit(".", 1)[0] for rel in rels])
        body = dataset_shard(dataset, rels)
        for prefix in ("streamed", "plain"):
            moto.s3.put_object(Bucket=BUCKET, Key=f"{prefix}/data-{s:06d}.tar", Body=body)
        manifest["shards"].append({"file": f"data-{s:06d}.tar", "samples": per, "bytes": len(body)})
    manifest["samples"] = per * SHARDS
    moto.s3.put_object(Bucket=BUCKET, Key="streamed/data.manifest.json", Body=json.dumps(manifest).encode())
    yield moto, proxy, keys
    proxy.close()
    moto.close()


@pytest.fixture
def creds(store, monkeypatch, tmp_path):
    moto, proxy, _ = store
    use_trainer_credentials(monkeypatch, moto, tmp_path, endpoint=proxy.url)
    proxy.reset()
    return moto


def job(prefix: str, shuffle: bool = True, batch: int = 4, shards: str = "") -> str:
    shards = shards or f"{prefix}/data-{{000000..{SHARDS - 1:06d}}}.tar"
    return (f"source: {{type: tar, shards: 's3://{BUCKET}/{shards}'}}\n"
            f"sampler: {{shuffle: {str(shuffle).lower()}, seed: 5}}\nbatch: {{size: {batch}}}\n"
            "transforms:\n  - resize: {shorter: 16}\n  - center_crop: {size: 16}\nprefetch: 2\non_error: fail\n")


def run_ranks(sock: str, config: str, epochs: int, world: int) -> tuple:
    """({(epoch, rank): [key, ...]}, [final stats values per rank]) from `world` loaders side by side."""
    out = {}
    loaders = [spdl_client.Loader(config, socket=sock, rank=r, world_size=world, epochs=epochs, timeout=60)
               for r in range(world)]
    try:
        for e in range(epochs):
            for r, loader in enumerate(loaders):
                out[(e, r)] = [p for b in loader for p in b.paths]
        stats = [loader.stats() for loader in loaders]
        assert all(s["finished"] for s in stats)  # the last epoch iterated: the daemon's final figures
        stats = [s["values"] for s in stats]
    finally:
        for loader in loaders:
            loader.close()
    return out, stats


def all_keys(keys: list) -> list:
    return sorted(k for shard in keys for k in shard)


def shard_paths(prefix: str) -> list:
    return [f"/{BUCKET}/{prefix}/data-{s:06d}.tar" for s in range(SHARDS)]


def cached_files(d: Path) -> list:
    return sorted(p for p in d.iterdir() if p.suffix == ".tar")


def test_with_a_manifest_the_first_batch_comes_before_the_other_shards(tmp_root, store, creds, dataset):
    """The last shard's download is held at the proxy: with a manifest the job starts and delivers
    the first shard's samples meanwhile (no full download before the first sample); then the whole
    epoch, each sample once, each shard fetched whole once."""
    _, proxy, keys = store
    d = start_spdld(tmp_root, "stream", proxy.url)
    last = shard_paths("streamed")[-1]
    proxy.held[last] = threading.Event()
    try:
        loader = spdl_client.Loader(job("streamed", shuffle=False), socket=d.sock, epochs=1, timeout=60)
        try:
            it = iter(loader)
            first = list(next(it).paths)  # the batch itself released: it holds a slot
            assert set(first) <= set(keys[0]), first
            assert proxy.full.get(last, 0) <= 1  # asked for, perhaps, but held: not arrived
            proxy.held[last].set()
            got = first + [p for b in it for p in b.paths]
        finally:
            loader.close()
        assert sorted(got) == all_keys(keys)
        assert [proxy.full.get(p, 0) for p in shard_paths("streamed")] == [1] * SHARDS, proxy.full
        assert sum(proxy.ranged.values()) == 0, proxy.ranged  # no per-member reads: the stream serves them
    finally:
        proxy.held.pop(last).set()
        d.stop()


def test_streamed_shards_2_ranks_2_epochs_exactly_once_and_resume_exact(tmp_root, store, creds):
    _, proxy, keys = store
    d = start_spdld(tmp_root, "stream2", proxy.url)
    try:
        out, _ = run_ranks(d.sock, job("streamed"), epochs=2, world=2)
        for e in range(2):
            assert sorted(out[(e, 0)] + out[(e, 1)]) == all_keys(keys)
            assert len(out[(e, 0)]) == len(out[(e, 1)])
        assert out[(0, 0)] != out[(1, 0)]
        # The same order as the scanned (manifest-less) copy of the dataset: the counts are the same.
        plain, _ = run_ranks(d.sock, job("plain"), epochs=2, world=2)
        assert plain == out
        # Resume mid-epoch: the rest of the epoch exactly.
        cfg = job("streamed")
        ref = spdl_client.Loader(cfg, socket=d.sock, epochs=2, timeout=60)
        try:
            want = [[list(b.paths) for b in ref] for _ in range(2)]
        finally:
            ref.close()
        first = spdl_client.Loader(cfg, socket=d.sock, epochs=2, timeout=60)
        try:
            for epoch in range(2):
                for i, _ in enumerate(first):
                    if epoch == 1 and i == 3:
                        saved = json.loads(json.dumps(first.state_dict()))
        finally:
            first.close()
        resumed = spdl_client.Loader(cfg, socket=d.sock, epochs=2, timeout=60)
        try:
            resumed.load_state_dict(saved)
            assert [list(b.paths) for b in resumed] == want[1][4:]
        finally:
            resumed.close()
    finally:
        d.stop()


def test_the_node_cache_fetches_each_shard_once_for_4_ranks_and_survives_a_restart(tmp_root, store, creds):
    _, proxy, keys = store
    cache = tmp_root / "shard-cache-a"
    d = start_spdld(tmp_root, "cache-a", proxy.url, f"cache_dir: {cache}\ncache_dir_bytes: 64MiB\n")
    try:
        out, stats = run_ranks(d.sock, job("plain"), epochs=2, world=4)
        for e in range(2):
            assert sorted(sum((out[(e, r)] for r in range(4)), [])) == all_keys(keys)
        assert [proxy.full.get(p, 0) for p in shard_paths("plain")] == [1] * SHARDS, proxy.full
        assert sum(proxy.ranged.values()) == 0, proxy.ranged
        # Every rank proved with its own credentials that it may read each shard (one probe each).
        assert all(proxy.probes.get(p, 0) >= 4 for p in shard_paths("plain")), proxy.probes
        assert sum(s["shard_cache_misses"] for s in stats) == SHARDS, stats
        assert sum(s["shard_cache_hits"] for s in stats) == 3 * SHARDS, stats
        assert all(s["s3_requests"] > 0 and s["s3_errors_5xx"] == 0 for s in stats), stats
        assert stats[0]["shard_cache_bytes"] == sum(p.stat().st_size for p in cached_files(cache))
        assert (cache.stat().st_mode & 0o777) == 0o700
        assert len(cached_files(cache)) == SHARDS
        status = subprocess.run([str(SPDLD.parent / "spdlctl"), "--socket", d.sock, "--json", "status"],
                                capture_output=True, text=True, timeout=10)
        assert status.returncode == 0, status.stderr
    finally:
        d.stop()
    proxy.reset()
    d = start_spdld(tmp_root, "cache-a", proxy.url, f"cache_dir: {cache}\ncache_dir_bytes: 64MiB\n")
    try:
        out, stats = run_ranks(d.sock, job("plain"), epochs=1, world=2)
        assert sorted(out[(0, 0)] + out[(0, 1)]) == all_keys(keys)
        assert sum(proxy.full.get(p, 0) for p in shard_paths("plain")) == 0, proxy.full  # the last run's files
        assert sum(s["shard_cache_misses"] for s in stats) == 0, stats
    finally:
        d.stop()


def test_the_node_cache_stays_within_its_budget_and_refetches_a_damaged_file(tmp_root, store, creds):
    _, proxy, keys = store
    moto = creds
    cache = tmp_root / "shard-cache-b"
    shard_bytes = moto.s3.head_object(Bucket=BUCKET, Key="plain/data-000000.tar")["ContentLength"]
    budget = int(shard_bytes * 2.5)
    d = start_spdld(tmp_root, "cache-b", proxy.url, f"cache_dir: {cache}\ncache_dir_bytes: {budget}\n")
    try:
        out, stats = run_ranks(d.sock, job("plain", shuffle=False), epochs=1, world=1)
        assert sorted(out[(0, 0)]) == all_keys(keys)
        # The job's shards stay pinned (never evicted while read) until the daemon has torn the job
        # down, a moment after its last batch reached the client: wait for that, boundedly.
        deadline = time.monotonic() + 10
        while True:
            held = sum(p.stat().st_size for p in cached_files(cache))
            if held <= budget or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert 0 < held <= budget, (held, budget)
        # Damage the last shard's cached file in place (same size): the next job that uses it finds
        # the damage and fetches the shard again.
        last = "plain/data-000003.tar"
        metas = [m for m in cache.iterdir() if m.suffix == ".meta" and last in m.read_text()]
        assert len(metas) == 1, list(cache.iterdir())
        victim = metas[0].with_suffix(".tar")
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
        proxy.reset()
        out, stats = run_ranks(d.sock, job("plain", shards=last), epochs=1, world=1)
        assert sorted(out[(0, 0)]) == sorted(keys[3])
        assert stats[0]["shard_cache_corrupt"] == 1, stats
        # Node-wide figures: the first job's shards beyond the budget were evicted once it let go.
        assert stats[0]["shard_cache_evictions"] >= SHARDS - 2, stats
        assert stats[0]["shard_cache_bytes"] <= budget, stats
        assert proxy.full.get(f"/{BUCKET}/{last}", 0) == 1, proxy.full
        assert victim.read_bytes() != bytes(data)  # the refetched file is the object again
    finally:
        d.stop()
    assert "failed its check" in d.logpath.read_text()


def test_an_unwritable_cache_dir_leaves_jobs_streaming_with_one_warning(tmp_root, store, creds):
    _, proxy, keys = store
    if os.geteuid() == 0:
        # root writes anywhere: a regular file where the directory should be is unusable for anyone.
        bad = tmp_root / "cache-is-a-file"
        bad.write_text("x")
    else:
        ro = tmp_root / "read-only"
        ro.mkdir(exist_ok=True)
        ro.chmod(0o500)
        bad = ro / "cache"
    d = start_spdld(tmp_root, "cache-c", proxy.url, f"cache_dir: {bad}\n")
    try:
        out, stats = run_ranks(d.sock, job("plain"), epochs=1, world=2)
        assert sorted(out[(0, 0)] + out[(0, 1)]) == all_keys(keys)
        assert all(s["shard_cache_budget_bytes"] == 0 for s in stats), stats
    finally:
        d.stop()
    log = d.logpath.read_text()
    assert log.count("remote shards are streamed without the cache") == 1, log


def test_a_cached_shard_is_not_served_to_credentials_that_cannot_read_it(tmp_root, store, creds, monkeypatch):
    """The multi-tenant rule: another principal's job is served a cached shard only after its own probe
    of the object succeeds; a key denied the object gets the store's 403 with the shard's URL, and
    nothing from the cache."""
    moto, proxy, keys = store
    other = moto.add_user("other", {
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "*", "Resource": "*"},
            {"Effect": "Deny", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{BUCKET}/plain/*"}]})
    cache = tmp_root / "shard-cache-d"
    d = start_spdld(tmp_root, "cache-d", proxy.url, f"cache_dir: {cache}\n")
    try:
        out, _ = run_ranks(d.sock, job("plain"), epochs=1, world=1)  # the trainer's key fills the cache
        assert sorted(out[(0, 0)]) == all_keys(keys)
        assert len(cached_files(cache)) == SHARDS
        proxy.reset()
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", other["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", other["SecretAccessKey"])
        with pytest.raises(spdl_client.SpdlError) as err:
            loader = spdl_client.Loader(job("plain"), socket=d.sock, epochs=1, timeout=30)
            try:
                for _ in loader:
                    pass
            finally:
                loader.close()
        msg = str(err.value)
        assert "403" in msg and "AccessDenied" in msg and f"s3://{BUCKET}/plain/data-" in msg, msg
        assert other["SecretAccessKey"] not in msg and other["AccessKeyId"] not in msg
        assert sum(proxy.full.get(p, 0) for p in shard_paths("plain")) == 0, proxy.full
        # The same key reads what it may: the streamed/ copy (not denied) is served.
        out, _ = run_ranks(d.sock, job("streamed"), epochs=1, world=1)
        assert sorted(out[(0, 0)]) == all_keys(keys)
    finally:
        d.stop()
    log = d.logpath.read_text()
    assert other["SecretAccessKey"] not in log and other["AccessKeyId"] not in log
