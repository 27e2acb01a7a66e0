"""Object storage against a real S3 server (moto, started here on 127.0.0.1 with signature checks
on) and a real spdld: s3:// tar shards (brace patterns), s3:// file lists and s3_prefix, each
delivering every sample exactly once over 2 epochs on 2 ranks; credentials sent by the client and
never shown; bad credentials; a proxy that cuts every first transfer mid-body; a server that stalls.
No test touches an address other than 127.0.0.1."""

from __future__ import annotations

import json
import socket as socketlib
import subprocess
import time

import pytest

import spdl_client
from conftest import BUILD, SpdldProcess
from s3_server import BUCKET, Moto, Proxy, content_length, dataset_shard, read_head, require_moto, \
    use_trainer_credentials

require_moto()

SPDLCTL = BUILD / "bin" / "spdlctl"
SHARDS = 4


class CuttingProxy(Proxy):
    """An HTTP proxy to `upstream` (127.0.0.1) that answers one request per connection and cuts the
    first response for each path (with a body over 2 KiB) after half its body: every object is cut
    once mid-transfer, the resumed Range request goes through."""

    def __init__(self, upstream_port: int) -> None:
        self.cut_paths: set = set()
        self.cuts = 0
        self.ranged = 0
        self.full: dict = {}  # path -> GETs without a Range
        self.ranged_by_path: dict = {}  # path -> GETs with a Range
        self.stall = False  # instead of cutting, send half the body and then nothing (for 20 s)
        self.corrupt = False  # flip a byte a quarter into every whole-object body
        self.if_match = 0  # requests that carried If-Match
        super().__init__(upstream_port)

    def handle(self, conn) -> None:
        req = read_head(conn)
        if not req:
            return
        line = req.split(b"\r\n", 1)[0].decode()
        path = line.split(" ")[1]
        # A 1-byte probe (Range: bytes=0-0: a job checking it may read a shard) is not a ranged read.
        probe = b"\r\nrange: bytes=0-0\r\n" in req.lower()
        ranged = b"\r\nrange:" in req.lower() and not probe
        up = self.upstream()
        up.sendall(req)
        resp = read_head(up)
        head, _, body = resp.partition(b"\r\n\r\n")
        length = content_length(head)
        while len(body) < length:
            chunk = up.recv(65536)
            if not chunk:
                break
            body += chunk
        up.close()
        with self.lock:
            self.ranged += ranged
            if ranged:
                self.ranged_by_path[path] = self.ranged_by_path.get(path, 0) + 1
            if not ranged and not probe and line.startswith("GET"):
                self.full[path] = self.full.get(path, 0) + 1
            self.if_match += b"\r\nif-match:" in req.lower()
            if self.corrupt and not ranged and length > 0 and line.startswith("GET") and "list-type" not in path:
                at = length // 4  # before any cut
                body = body[:at] + bytes([body[at] ^ 0xFF]) + body[at + 1:]
            cut = length > 2048 and path not in self.cut_paths and line.startswith("GET")
            if cut:
                self.cut_paths.add(path)
                self.cuts += 1
        head += b"\r\nConnection: close"
        conn.sendall(head + b"\r\n\r\n" + (body[: length // 2] if cut else body))
        if cut and self.stall:
            deadline = time.monotonic() + 20
            while not self._stop and time.monotonic() < deadline:
                time.sleep(0.1)


class Silent:
    """Accepts connections on 127.0.0.1 and never answers."""

    def __init__(self) -> None:
        self.sock = socketlib.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def store(tmp_root, dataset):
    """(moto, proxy, silent, keys): the dataset uploaded three ways: as SHARDS tar shards under
    shards/, as objects under folder/<class>/<file> (the file list and the prefix read them)."""
    moto = Moto(tmp_root)
    proxy = CuttingProxy(moto.port)
    silent = Silent()
    per = len(dataset.files) // SHARDS
    keys = [rel.rsplit(".", 1)[0] for rel in dataset.files[:SHARDS * per]]
    for s in range(SHARDS):
        moto.s3.put_object(Bucket=BUCKET, Key=f"shards/train-{s:03d}.tar",
                           Body=dataset_shard(dataset, dataset.files[s * per:(s + 1) * per]))
    for rel in dataset.files:
        moto.s3.put_object(Bucket=BUCKET, Key=f"folder/{rel}", Body=(dataset.root / rel).read_bytes())
    yield moto, proxy, silent, keys
    proxy.close()
    silent.close()
    moto.close()


@pytest.fixture(scope="module")
def s3d(tmp_root, store):
    """(socket, log path): a spdld allowed the bucket on moto and through the proxy, and the silent
    server; logging at debug level so that the no-secret check sees the most."""
    moto, proxy, silent, _ = store
    d = SpdldProcess(tmp_root, "s3", [f"{u}/{BUCKET}" for u in (moto.url, proxy.url, silent.url)], log_level="debug")
    yield d.sock, d.logpath
    d.stop()


@pytest.fixture
def creds(store, monkeypatch, tmp_path):
    """The trainer's environment: the moto key, endpoint and region; no credentials file."""
    moto = store[0]
    use_trainer_credentials(monkeypatch, moto, tmp_path)
    return moto


# Every error message the tests saw, for the no-secret check at the end, and temporary secrets.
SEEN: list = []
TEMPORARY: list = []
LOGS: list = []  # daemon logs of fixtures already torn down


def job(source: str, batch: int = 5) -> str:
    return (f"source: {source}\nsampler: {{shuffle: true, seed: 3}}\nbatch: {{size: {batch}}}\n"
            "transforms:\n  - resize: {shorter: 32}\n  - center_crop: {size: 32}\nprefetch: 2\non_error: fail\n")


def run_ranks(sock: str, config: str, epochs: int = 2, world: int = 2) -> dict:
    """{(epoch, rank): [(path, label), ...]} from `world` loaders run side by side."""
    out = {}
    loaders = [spdl_client.Loader(config, socket=sock, rank=r, world_size=world, epochs=epochs, timeout=60)
               for r in range(world)]
    try:
        for e in range(epochs):
            for r, loader in enumerate(loaders):
                got = []
                for b in loader:
                    got += list(zip(b.paths, b.labels))
                    SEEN.append(json.dumps(loader.stats(), default=str))
                out[(e, r)] = got
    finally:
        for loader in loaders:
            loader.close()
    return out


def assert_exactly_once(out: dict, expected: dict, epochs: int = 2, world: int = 2) -> None:
    for e in range(epochs):
        seen = [p for r in range(world) for p in out[(e, r)]]
        assert sorted(seen) == sorted(expected.items()), f"epoch {e}"
        assert len({len(out[(e, r)]) for r in range(world)}) == 1  # equal per rank (48 divides evenly)
    assert [p for p, _ in out[(0, 0)]] != [p for p, _ in out[(1, 0)]]  # a new order each epoch


def test_s3_tar_shards_every_sample_once_over_2_epochs_on_2_ranks(s3d, store, creds, dataset):
    sock, _ = s3d
    _, _, _, keys = store
    expected = {rel.rsplit(".", 1)[0]: dataset.label_of[rel] for rel in dataset.files}
    out = run_ranks(sock, job(f"{{type: tar, shards: 's3://{BUCKET}/shards/train-{{000..{SHARDS - 1:03d}}}.tar', "
                              "shuffle_buffer: 1}"))
    assert_exactly_once(out, expected)
    # Ranks get whole shards: each rank's samples of an epoch come from SHARDS / 2 shards (with a
    # shuffle buffer of 1; a larger buffer may carry up to that many samples over a rank boundary).
    shard_of = {k: i // (len(keys) // SHARDS) for i, k in enumerate(keys)}
    for (e, r), got in out.items():
        assert len({shard_of[p] for p, _ in got}) == SHARDS // 2, (e, r)


def test_s3_file_list_every_sample_once_over_2_epochs_on_2_ranks(s3d, creds, dataset, tmp_root):
    sock, _ = s3d
    lst = tmp_root / "s3-list.txt"
    lst.write_text("".join(f"s3://{BUCKET}/folder/{rel},{dataset.label_of[rel]}\n" for rel in dataset.files))
    expected = {f"s3://{BUCKET}/folder/{rel}": dataset.label_of[rel] for rel in dataset.files}
    assert_exactly_once(run_ranks(sock, job(f"{{type: file_list, list: {lst}}}")), expected)
    # An http URL list of s3:// lines reads the same objects.
    out = run_ranks(sock, job(f"{{type: http, list: {lst}}}"), epochs=1, world=1)
    assert sorted(out[(0, 0)]) == sorted(expected.items())


def test_s3_prefix_lists_the_objects_and_labels_by_first_component(s3d, creds, dataset):
    sock, _ = s3d
    expected = {f"s3://{BUCKET}/folder/{rel}": dataset.label_of[rel] for rel in dataset.files}
    out = run_ranks(sock, job(f"{{type: s3_prefix, prefix: 's3://{BUCKET}/folder/'}}"), epochs=1, world=1)
    assert sorted(out[(0, 0)]) == sorted(expected.items())


def test_credentials_from_the_shared_credentials_file(s3d, creds, dataset, tmp_path, monkeypatch):
    sock, _ = s3d
    moto = creds
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n"
        f"[train]\naws_access_key_id = {moto.key_id}\naws_secret_access_key = {moto.secret}\n")
    monkeypatch.setenv("AWS_PROFILE", "train")
    out = run_ranks(sock, job(f"{{type: s3_prefix, prefix: 's3://{BUCKET}/folder'}}"), epochs=1, world=1)
    assert len(out[(0, 0)]) == len(dataset.files)


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_s3_shards_of_different_sizes_keep_uneven_exact(s3d, store, creds, dataset, uneven):
    sock, _ = s3d
    moto = store[0]
    sizes = [7, 13, 27]  # 47 samples: odd, and no shard boundary at the rank boundary
    files = dataset.files[:sum(sizes)]
    start = 0
    for i, n in enumerate(sizes):
        moto.s3.put_object(Bucket=BUCKET, Key=f"odd/part-{i}.tar", Body=dataset_shard(dataset, files[start:start + n]))
        start += n
    cfg = job(f"{{type: tar, shards: 's3://{BUCKET}/odd/part-{{0..2}}.tar'}}").replace(
        "sampler: {shuffle: true, seed: 3}", f"sampler: {{shuffle: true, seed: 3, uneven: {uneven}}}")
    out = run_ranks(sock, cfg, epochs=1, world=2)
    per_rank = [len(out[(0, r)]) for r in range(2)]
    every = [p for r in range(2) for p, _ in out[(0, r)]]
    keys = {rel.rsplit(".", 1)[0] for rel in files}
    if uneven == "pad":
        assert per_rank == [24, 24] and set(every) == keys and len(every) == 48
    else:
        assert per_rank == [23, 23] and len(set(every)) == 46 and set(every) <= keys


def test_s3_tar_shards_resume_exactly_mid_epoch(s3d, creds):
    sock, _ = s3d
    cfg = job(f"{{type: tar, shards: 's3://{BUCKET}/shards/train-{{000..{SHARDS - 1:03d}}}.tar', "
              "shuffle_buffer: 8}", batch=4)
    ref = spdl_client.Loader(cfg, socket=sock, epochs=2, timeout=60)
    try:
        want = [[list(b.paths) for b in ref] for _ in range(2)]
    finally:
        ref.close()
    first = spdl_client.Loader(cfg, socket=sock, epochs=2, timeout=60)
    try:
        for epoch in range(2):
            for i, _ in enumerate(first):
                if epoch == 1 and i == 4:
                    saved = json.loads(json.dumps(first.state_dict()))
    finally:
        first.close()
    resumed = spdl_client.Loader(cfg, socket=sock, epochs=2, timeout=60)
    try:
        resumed.load_state_dict(saved)
        assert [list(b.paths) for b in resumed] == want[1][5:]
    finally:
        resumed.close()


def test_temporary_credentials_with_a_session_token(s3d, creds, monkeypatch):
    sock, _ = s3d
    moto = creds
    tmp = moto.temporary_credentials("reader", "train")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", tmp["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", tmp["SecretAccessKey"])
    monkeypatch.setenv("AWS_SESSION_TOKEN", tmp["SessionToken"])
    TEMPORARY.extend([tmp["SecretAccessKey"], tmp["SessionToken"]])
    out = run_ranks(sock, job(f"{{type: s3_prefix, prefix: 's3://{BUCKET}/folder/'}}"), epochs=1, world=1)
    assert len(out[(0, 0)]) > 0
    # Without the token the same temporary key is refused.
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    with pytest.raises(spdl_client.SpdlError) as err:
        spdl_client.Loader(job(f"{{type: s3_prefix, prefix: 's3://{BUCKET}/folder/'}}"), socket=sock, epochs=1,
                           timeout=30)
    SEEN.append(str(err.value))
    assert "403" in str(err.value), str(err.value)


def test_bad_credentials_fail_the_job_once_with_the_store_code_and_key(s3d, creds, monkeypatch):
    sock, _ = s3d
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-" + creds.secret[:4])
    with pytest.raises(spdl_client.SpdlError) as err:
        spdl_client.Loader(job(f"{{type: tar, shards: 's3://{BUCKET}/shards/train-000.tar'}}"), socket=sock,
                           epochs=1, timeout=30)
    msg = str(err.value)
    SEEN.append(msg)
    assert "SignatureDoesNotMatch" in msg and "403" in msg, msg
    assert f"s3://{BUCKET}/shards/train-000.tar" in msg, msg
    assert msg.count("SignatureDoesNotMatch") == 1, msg  # once, not once per attempt
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOSUCHKEY0000000")
    with pytest.raises(spdl_client.SpdlError, match="InvalidAccessKeyId") as err:
        spdl_client.Loader(job(f"{{type: s3_prefix, prefix: 's3://{BUCKET}/folder/'}}"), socket=sock, epochs=1,
                           timeout=30)
    SEEN.append(str(err.value))


def test_a_proxy_that_cuts_every_object_mid_transfer_the_job_completes_exactly(s3d, store, creds, dataset,
                                                                              monkeypatch):
    sock, _ = s3d
    _, proxy, _, _ = store
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    expected = {rel.rsplit(".", 1)[0]: dataset.label_of[rel] for rel in dataset.files}
    cfg = job(f"{{type: tar, shards: 's3://{BUCKET}/shards/train-{{000..{SHARDS - 1:03d}}}.tar', "
              "s3: {initial_backoff_ms: 10, max_backoff_ms: 50}}")
    assert_exactly_once(run_ranks(sock, cfg), expected)
    assert proxy.cuts >= SHARDS and proxy.ranged >= SHARDS, (proxy.cuts, proxy.ranged)
    assert proxy.if_match >= proxy.ranged  # every ranged read names the version it continues or indexed
    # Each rank's job streamed each shard whole once (the cut transfer resumed, not restarted); with
    # the node's shard cache it is once per node (test_with_the_shard_cache_4_ranks_...).
    shard_gets = {p: n for p, n in proxy.full.items() if "/shards/" in p and p.endswith(".tar")}
    assert sorted(shard_gets.values()) == [2] * SHARDS, shard_gets
    # Objects read whole (the file list) resume too.
    proxy.cut_paths.clear()
    cuts = proxy.cuts
    out = run_ranks(sock, job(f"{{type: s3_prefix, prefix: 's3://{BUCKET}/folder/', "
                              "s3: {initial_backoff_ms: 10, max_backoff_ms: 50}}"), epochs=1, world=1)
    assert sorted(out[(0, 0)]) == sorted({f"s3://{BUCKET}/folder/{r}": dataset.label_of[r]
                                          for r in dataset.files}.items())
    big = sum(1 for r in dataset.files if (dataset.root / r).stat().st_size > 2048)
    assert big > 0 and proxy.cuts - cuts >= big, (proxy.cuts - cuts, big)


def test_a_transfer_that_stalls_mid_shard_is_cut_and_resumed(s3d, store, creds, dataset, monkeypatch):
    sock, _ = s3d
    moto, proxy, _, _ = store
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    key = "shards/train-003.tar"
    proxy.cut_paths.discard(f"/{BUCKET}/{key}")
    proxy.stall = True
    try:
        t0 = time.monotonic()
        cfg = job(f"{{type: tar, shards: 's3://{BUCKET}/{key}', s3: {{stall_timeout_ms: 1000, timeout_ms: 60000}}}}")
        out = run_ranks(sock, cfg, epochs=1, world=1)
        waited = time.monotonic() - t0
    finally:
        proxy.stall = False
    per = len(dataset.files) // SHARDS
    assert len(out[(0, 0)]) == per and len(set(out[(0, 0)])) == per
    assert f"/{BUCKET}/{key}" in proxy.cut_paths
    assert waited < 15, waited  # the stall was cut after about a second, not after timeout_ms


def test_a_body_that_differs_from_its_md5_etag_fails_clearly(s3d, store, creds, monkeypatch):
    sock, _ = s3d
    _, proxy, _, _ = store
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    proxy.corrupt = True
    try:
        with pytest.raises(spdl_client.SpdlError) as err:
            spdl_client.Loader(job(f"{{type: tar, shards: 's3://{BUCKET}/shards/train-001.tar'}}"), socket=sock,
                               epochs=1, timeout=30)
    finally:
        proxy.corrupt = False
    msg = str(err.value)
    SEEN.append(msg)
    assert "differs from the object's ETag" in msg and f"s3://{BUCKET}/shards/train-001.tar" in msg, msg


def test_a_shard_replaced_while_a_job_reads_it_never_mixes_versions(s3d, store, creds):
    """A job reads the version of a shard it first probed (the download carries If-Match with that
    ETag; a replaced object fails it with 412, never mixing bytes); a job started after the
    replacement reads the new version."""
    sock, _ = s3d
    moto, _, _, keys = store
    key = "shards/train-002.tar"
    original = moto.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    cfg = job(f"{{type: tar, shards: 's3://{BUCKET}/{key}', shuffle_buffer: 1}}")
    loader = spdl_client.Loader(cfg, socket=sock, epochs=1, timeout=30)
    try:
        moto.s3.put_object(Bucket=BUCKET, Key=key, Body=original + b"\0" * 1024)  # new ETag, same members
        got = [p for b in loader for p in b.paths]
        per = len(keys) // SHARDS
        assert sorted(got) == sorted(keys[2 * per:3 * per])
        after = spdl_client.Loader(cfg, socket=sock, epochs=1, timeout=30)
        try:
            assert sorted(p for b in after for p in b.paths) == sorted(got)
        finally:
            after.close()
    finally:
        loader.close()
        moto.s3.put_object(Bucket=BUCKET, Key=key, Body=original)


def test_a_stalled_server_is_a_bounded_wait_then_a_clear_error(s3d, store, creds, monkeypatch):
    sock, _ = s3d
    _, _, silent, _ = store
    monkeypatch.setenv("AWS_ENDPOINT_URL", silent.url)
    cfg = job(f"{{type: tar, shards: 's3://{BUCKET}/shards/train-000.tar', "
              "s3: {timeout_ms: 1000, max_attempts: 2, initial_backoff_ms: 100, max_backoff_ms: 200}}")
    t0 = time.monotonic()
    with pytest.raises(spdl_client.SpdlError) as err:
        spdl_client.Loader(cfg, socket=sock, epochs=1, timeout=30)
    waited = time.monotonic() - t0
    msg = str(err.value)
    SEEN.append(msg)
    assert waited < 10, waited
    assert "no complete response within 1000 ms" in msg and "gave up after 2 attempts" in msg, msg
    assert f"s3://{BUCKET}/shards/train-000.tar" in msg, msg


def test_the_admin_allows_endpoints_and_buckets_by_url_prefix(s3d, creds):
    sock, _ = s3d
    with pytest.raises(spdl_client.SpdlError, match="not below any of the daemon's allowed_url_prefixes") as err:
        spdl_client.Loader(job("{type: s3_prefix, prefix: 's3://other-bucket/x/'}"), socket=sock, epochs=1,
                           timeout=30)
    SEEN.append(str(err.value))


@pytest.fixture(scope="module")
def s3d_cached(tmp_root, store):
    """A spdld with the node-wide sample cache (cache_bytes) and shard cache (cache_dir) on, allowed
    the proxy."""
    _, proxy, _, _ = store
    d = SpdldProcess(tmp_root, "s3c", [f"{proxy.url}/{BUCKET}"], log_level="debug",
                     extra=f"cache_bytes: 67108864\ncache_dir: {tmp_root / 's3c-shard-cache'}\n")
    yield d.sock, d.logpath
    try:
        d.stop()
    finally:
        LOGS.append(d.logpath)


def test_with_the_shard_cache_4_ranks_fetch_each_shard_once_per_node(s3d_cached, store, creds, dataset,
                                                                    monkeypatch):
    """4 ranks x 2 epochs on one node, through a proxy that cuts every shard's first transfer: each
    shard is fetched whole once for the node (the download resumed once where it was cut), every
    rank probing it with its own credentials first; no per-member reads."""
    sock, _ = s3d_cached
    moto, proxy, _, _ = store
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    per = len(dataset.files) // SHARDS
    for s in range(SHARDS):
        moto.s3.put_object(Bucket=BUCKET, Key=f"cached/part-{s}.tar",
                           Body=dataset_shard(dataset, dataset.files[s * per:(s + 1) * per]))
    before_ranged = proxy.ranged_by_path.copy()
    cfg = job(f"{{type: tar, shards: 's3://{BUCKET}/cached/part-{{0..{SHARDS - 1}}}.tar'}}", batch=4)
    expected = {rel.rsplit(".", 1)[0]: dataset.label_of[rel] for rel in dataset.files}
    assert_exactly_once(run_ranks(sock, cfg, epochs=2, world=4), expected, epochs=2, world=4)
    shards = [f"/{BUCKET}/cached/part-{s}.tar" for s in range(SHARDS)]
    assert [proxy.full.get(p, 0) for p in shards] == [1] * SHARDS, proxy.full
    ranged = {p: proxy.ranged_by_path.get(p, 0) - before_ranged.get(p, 0) for p in shards}
    assert all(n <= 1 for n in ranged.values()), ranged  # the resume after the cut, nothing per member


def test_no_credential_in_any_log_stats_status_or_error(s3d, store, creds):
    """Runs last in this file: everything the daemon said and logged holds neither the secret key nor
    the access key id."""
    sock, logpath = s3d
    moto = store[0]
    for args in (["status"], ["jobs"], ["--json", "status"], ["--json", "jobs"]):
        r = subprocess.run([str(SPDLCTL), "--socket", sock, *args], capture_output=True, text=True, timeout=10)
        SEEN.append(r.stdout + r.stderr)
    texts = SEEN + [p.read_text(errors="replace") for p in [logpath, *LOGS]]
    assert len(SEEN) > 10  # the other tests ran and recorded what they saw
    assert "s3://" in texts[-1] or any("s3://" in t for t in texts)
    for t in texts:
        assert moto.secret not in t
        assert moto.key_id not in t
        for secret in TEMPORARY:
            assert secret not in t
