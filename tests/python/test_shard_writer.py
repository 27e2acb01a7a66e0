"""spdl-shard (tools/spdl_shard.py), the shard writer: a folder written as tar shards and read back
by the real spdld gives the folder job's records (keys, labels, pixels); a list with captions gives
the list job's records and extra outputs; two runs (and any --workers) are byte-identical;
--shard-bytes bounds each file; --max-side re-encodes to the right sizes; the manifest's checksums
verify (`spdl-shard verify`, which finds a corrupted shard); COCO annotations travel as .json and
scale with the image; bad input fails clearly leaving no partial shard; the progress bar on a
terminal; writing to s3:// (moto on 127.0.0.1: shared credentials file, temporary credentials, a
503 retried, bad credentials refused) and a job reading those shards; the SigV4 signer against
AWS's published example."""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

import spdl_client
from conftest import REPO, SpdldProcess, subprocess_env
from s3_server import BUCKET, OTHER_AWS_VARS, Moto, Proxy, read_message, require_moto, use_trainer_credentials

TOOL = REPO / "tools" / "spdl_shard.py"
sys.path.insert(0, str(TOOL.parent))
import spdl_shard  # noqa: E402


def run_tool(*args, env=None, check=True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, str(TOOL), *map(str, args), "--no-progress"], capture_output=True,
                       text=True, env=env, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def job(source: str) -> str:
    return (f"source: {source}\nsampler: {{shuffle: false, seed: 1}}\nbatch: {{size: 8, drop_last: false}}\n"
            "transforms:\n  - resize: {shorter: 48}\n  - center_crop: {size: 40}\nprefetch: 2\non_error: fail\n")


def records(sock: str, config: str) -> list:
    """[(path, label, pixels bytes), ...] of one epoch of `config`, in delivery order; with an extra
    output "cap" (a sidecar), (path, label, pixels, sidecar bytes)."""
    out = []
    loader = spdl_client.Loader(config, socket=sock, timeout=60)
    try:
        for b in loader:
            images = np.from_dlpack(b["image"])
            rows = [(p, int(label), images[i].tobytes()) for i, (p, label) in enumerate(zip(b.paths, b.labels))]
            if "cap" in b:
                cap, n = np.from_dlpack(b["cap"]), np.from_dlpack(b["cap_length"])
                rows = [r + (bytes(cap[i, : int(n[i])]),) for i, r in enumerate(rows)]
            out += rows
    finally:
        loader.close()
    return out


def shard_pattern(manifest: dict, where) -> str:
    return f"{where}/{manifest['pattern']}"


def test_folder_round_trip_equals_the_folder_job(daemon, dataset, tmp_path_factory):
    out = daemon.tmp / "shards-rt"
    run_tool(out, "--folder", dataset.root, "--shard-size", 10)
    manifest = json.loads((out / "shard.manifest.json").read_text())
    assert [s["samples"] for s in manifest["shards"]] == [10, 10, 10, 10, 8]
    assert manifest["samples"] == len(dataset.files) and manifest["classes"] == sorted(
        {rel.split("/")[0] for rel in dataset.files})
    folder = records(daemon.socket, job(f"{{type: image_folder, root: {dataset.root}}}"))
    shards = records(daemon.socket, job(f"{{type: tar, shards: '{shard_pattern(manifest, out)}'}}"))
    assert len(folder) == len(dataset.files)
    # Keys are the folder's paths without their extension; same order, labels and pixels.
    assert [(p.rsplit(".", 1)[0], label, px) for p, label, px in folder] == shards


def test_two_runs_are_byte_identical_and_the_manifest_verifies(dataset, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        run_tool(d, "--folder", dataset.root, "--shard-bytes", "40k", "--shuffle", 5)
        time.sleep(1.1)  # a later wall clock must not change anything
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and len(names) > 3
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n
    manifest = json.loads((a / "shard.manifest.json").read_text())
    assert sum(s["samples"] for s in manifest["shards"]) == len(dataset.files)
    for s in manifest["shards"]:
        data = (a / s["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == s["sha256"] and len(data) == s["bytes"]
        # --shard-bytes: no shard is larger than 40 KiB, and the next sample would not have fitted.
        assert len(data) <= 40 * 1024
        with tarfile.open(a / s["file"]) as t:
            members = t.getmembers()
            assert len(data) == sum(512 + (m.size + 511) // 512 * 512 for m in members) + 1024
            assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o644)}
            assert len(members) == 2 * s["samples"]  # .jpg + .cls
    # --shuffle mixed the classes across shards.
    with tarfile.open(a / manifest["shards"][0]["file"]) as t:
        assert len({m.name.split("/")[0] for m in t.getmembers()}) > 1
    # `spdl-shard verify` agrees, and finds a corrupted shard.
    r = subprocess.run([sys.executable, str(TOOL), "verify", str(a / "shard.manifest.json")], capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.startswith(f"ok: {len(names) - 1} shards, 48 samples"), r.stderr
    first = a / manifest["shards"][1]["file"]
    raw = bytearray(first.read_bytes())
    raw[1000] ^= 0xFF
    first.write_bytes(bytes(raw))
    r = subprocess.run([sys.executable, str(TOOL), "verify", str(a / "shard.manifest.json")], capture_output=True,
                       text=True)
    assert r.returncode == 1 and f"{first.name}: {len(raw)} bytes, sha256 " in r.stderr
    assert "1 of " in r.stderr
    # A smaller rewrite into the same folder says that older shards are still there.
    r = run_tool(a, "--folder", dataset.root, "--shard-size", 100)
    assert f"also holds {len(names) - 2} older shards not in this manifest" in r.stderr
    assert json.loads((a / "shard.manifest.json").read_text())["pattern"] == "shard-{000000..000000}.tar"


def test_max_side_reencodes_to_the_right_sizes(daemon, dataset, tmp_path):
    from PIL import Image

    out = daemon.tmp / "shards-small"
    run_tool(out, "--folder", dataset.root, "--shard-size", 100, "--max-side", 72, "--quality", 80, "--workers", 3)
    manifest = json.loads((out / "shard.manifest.json").read_text())
    # One process or three: the same bytes.
    run_tool(tmp_path / "one", "--folder", dataset.root, "--shard-size", 100, "--max-side", 72, "--quality", 80,
             "--workers", 1)
    assert (tmp_path / "one" / "shard-000000.tar").read_bytes() == (out / "shard-000000.tar").read_bytes()
    assert manifest["options"]["max_side"] == 72
    with tarfile.open(out / manifest["shards"][0]["file"]) as t:
        got = {m.name: t.extractfile(m).read() for m in t.getmembers()}
    checked = 0
    for rel in dataset.files:
        w, h = Image.open(dataset.root / rel).size
        img = Image.open(io.BytesIO(got[rel.rsplit(".", 1)[0] + ".jpg"]))
        assert img.format == "JPEG"
        s = min(1.0, 72 / max(w, h))
        assert img.size == (max(1, round(w * s)), max(1, round(h * s))), (rel, (w, h), img.size)
        checked += max(w, h) > 72
    assert checked > 10  # the dataset's sides are 64..160: most were scaled
    # The re-encoded shards are read by the daemon: every sample, labels kept.
    recs = records(daemon.socket, job(f"{{type: tar, shards: '{shard_pattern(manifest, out)}'}}"))
    assert sorted((p, label) for p, label, _ in recs) == sorted(
        (rel.rsplit(".", 1)[0], dataset.label_of[rel]) for rel in dataset.files)


def test_file_list_and_sidecars(daemon, dataset, tmp_path):
    picked = dataset.files[::3]
    root = daemon.tmp / "list-copy"  # the images with captions next to some of them (below the allowed root)
    for rel in picked:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes((dataset.root / rel).read_bytes())
    for rel in picked[:4]:
        (root / rel).with_suffix(".txt").write_text(f"caption of {rel}")
    lst = root / "list.csv"
    lst.write_text("path,label\n# a comment\n" + "".join(
        f"{rel},{dataset.label_of[rel] + 10}\n" for rel in picked))
    out = daemon.tmp / "shards-list"
    run_tool(out, "--list", lst, "--root", root, "--sidecar", "txt", "--name", "lst")
    manifest = json.loads((out / "lst.manifest.json").read_text())
    assert manifest["samples"] == len(picked) and "classes" not in manifest
    with tarfile.open(out / "lst-000000.tar") as t:
        names = [m.name for m in t.getmembers()]
        txt = t.extractfile(picked[0].rsplit(".", 1)[0] + ".txt").read().decode()
    assert sum(n.endswith(".txt") for n in names) == 4 and txt == f"caption of {picked[0]}"
    # The shard job delivers what the list job does: keys (paths without extension), labels,
    # pixels and the captions (extra_outputs), empty where a sample has none.
    extra = "extra_outputs:\n  - {name: cap, from: .txt, max_bytes: 64, on_missing: empty}\n"
    from_list = records(daemon.socket, job(f"{{type: file_list, list: {lst}, root: {root}}}") + extra)
    from_shards = records(daemon.socket, job(f"{{type: tar, shards: '{out}/lst-000000.tar'}}") + extra)
    assert [(p, label) for p, label, _, _ in from_shards] == [
        (rel.rsplit(".", 1)[0], dataset.label_of[rel] + 10) for rel in picked]
    assert [(str(Path(p).relative_to(root)).rsplit(".", 1)[0] if p.startswith("/") else p.rsplit(".", 1)[0],
             label, px, cap) for p, label, px, cap in from_list] == from_shards
    assert sum(bool(cap) for *_, cap in from_shards) == 4


def test_coco_annotations_travel_as_json_and_scale_with_the_image(dataset, tmp_path):
    from PIL import Image

    images, anns = [], []
    for i, rel in enumerate(dataset.files[:5]):
        w, h = Image.open(dataset.root / rel).size
        images.append({"id": 100 - i, "file_name": rel, "width": w, "height": h})
        anns.append({"id": i + 1, "image_id": 100 - i, "category_id": 3, "bbox": [2, 4, w / 2, h / 2],
                     "area": w * h / 4, "iscrowd": 0, "segmentation": [[2, 4, 2 + w / 2, 4, 2, 4 + h / 2]]})
    coco = tmp_path / "instances.json"
    coco.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": 3, "name": "thing"}]}))
    out = tmp_path / "coco"
    run_tool(out, "--coco", coco, "--root", dataset.root, "--max-side", 50)
    manifest = json.loads((out / "shard.manifest.json").read_text())
    assert manifest["categories"] == [{"id": 3, "name": "thing"}]
    with tarfile.open(out / "shard-000000.tar") as t:
        members = {m.name: t.extractfile(m).read() for m in t.getmembers()}
    keys = [n.rsplit(".", 1)[0] for n in members if n.endswith(".json")]
    # Image id order (ids 96..100 are files 4..0).
    assert keys == [rel.rsplit(".", 1)[0] for rel in reversed(dataset.files[:5])]
    for img in images:
        key = img["file_name"].rsplit(".", 1)[0]
        doc = json.loads(members[key + ".json"])
        pic = Image.open(io.BytesIO(members[key + ".jpg"]))
        assert (doc["image"]["width"], doc["image"]["height"]) == pic.size and max(pic.size) <= 50
        sx, sy = pic.size[0] / img["width"], pic.size[1] / img["height"]
        (a,) = doc["annotations"]
        assert a["bbox"] == pytest.approx([2 * sx, 4 * sy, img["width"] / 2 * sx, img["height"] / 2 * sy])
        assert a["segmentation"][0][:2] == pytest.approx([2 * sx, 4 * sy])


def test_bad_input_is_a_clear_error_and_leaves_no_partial_shard(dataset, tmp_path):
    r = run_tool(tmp_path / "o", "--folder", tmp_path / "missing", check=False)
    assert r.returncode == 1 and "missing: not a directory" in r.stderr
    lst = tmp_path / "bad.txt"
    lst.write_text(f"{dataset.root / dataset.files[0]},x\n")
    r = run_tool(tmp_path / "o", "--list", lst, check=False)
    assert r.returncode == 1 and "bad.txt:1: label 'x' is not an integer >= 0" in r.stderr
    coco = tmp_path / "coco.json"
    coco.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}, {"file_name": "b.jpg"}]}))
    r = run_tool(tmp_path / "o", "--coco", coco, "--root", tmp_path, check=False)
    assert r.returncode == 1 and 'images[1] needs an integer "id" and a "file_name"' in r.stderr
    # A file that cannot be decoded while re-encoding: an error naming it, no .partial left behind.
    bad = tmp_path / "folder" / "a"
    bad.mkdir(parents=True)
    (bad / "ok.jpg").write_bytes((dataset.root / dataset.files[0]).read_bytes())
    (bad / "zz.jpg").write_bytes(b"not a jpeg")
    r = run_tool(tmp_path / "o2", "--folder", bad.parent, "--max-side", 32, check=False)
    assert r.returncode == 1 and "a/zz.jpg: cannot decode the image" in r.stderr
    assert list((tmp_path / "o2").iterdir()) == []
    # Two files with one key.
    (bad / "zz.jpg").unlink()
    (bad / "ok.png").write_bytes(b"x")
    r = run_tool(tmp_path / "o3", "--folder", bad.parent, check=False)
    assert r.returncode == 1 and "two samples have the key 'a/ok'" in r.stderr


def test_progress_bar_on_a_terminal(dataset, tmp_path):
    master, slave = os.openpty()
    try:
        r = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "o"), "--folder", str(dataset.root),
                            "--shard-size", "16"], stderr=slave, stdout=subprocess.PIPE, timeout=120)
        os.close(slave)
        slave = -1
        shown = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            shown += chunk
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    assert r.returncode == 0
    last = shown.decode().replace("\r\n", "\n").split("\r")[-1]
    assert last.startswith("[" + "#" * 30 + "] 48/48 samples, 3 shards"), shown


def test_sigv4_matches_the_aws_example():
    # AWS S3 documentation, "Signature Calculations for the Authorization Header", GET Object example.
    h = spdl_shard.sigv4_headers(
        "GET", "examplebucket.s3.amazonaws.com", "/test.txt", {}, {"Range": "bytes=0-9"},
        hashlib.sha256(b"").hexdigest(), "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "us-east-1", datetime.datetime(2013, 5, 24, tzinfo=datetime.timezone.utc))
    assert h["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


def test_credentials_resolution_matches_the_client(tmp_path):
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n\n"
        "[train]\naws_access_key_id = T\naws_secret_access_key = TS\naws_session_token = TT\n")
    base = {"HOME": str(tmp_path)}
    assert spdl_shard.s3_access(base)["key_id"] == "D"
    got = spdl_shard.s3_access(dict(base, AWS_PROFILE="train", AWS_DEFAULT_REGION="eu-west-1",
                                    AWS_ENDPOINT_URL="http://a", AWS_ENDPOINT_URL_S3="http://b"))
    assert (got["key_id"], got["secret"], got["token"], got["region"], got["endpoint"]) == (
        "T", "TS", "TT", "eu-west-1", "http://b")
    env = dict(base, AWS_ACCESS_KEY_ID="E", AWS_SECRET_ACCESS_KEY="ES", AWS_PROFILE="train")
    assert (spdl_shard.s3_access(env)["key_id"], spdl_shard.s3_access(env)["token"]) == ("E", "")


# ---- s3:// output against moto on 127.0.0.1 ----


@pytest.fixture(scope="module")
def moto_store(tmp_path_factory):
    require_moto()
    with Moto(tmp_path_factory.mktemp("moto-shard")) as moto:
        yield moto


@pytest.fixture(scope="module")
def s3_daemon(tmp_root, moto_store):
    """A spdld allowed the test bucket on moto."""
    d = SpdldProcess(tmp_root, "shard-s3", [f"{moto_store.url}/{BUCKET}"], io_threads=2)
    yield d.sock
    d.stop()


def moto_env(moto, tmp_path, **extra) -> dict:
    env = subprocess_env(**dict({"AWS_ENDPOINT_URL": moto.url, "AWS_REGION": "us-east-1", "HOME": tmp_path}, **extra))
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", *OTHER_AWS_VARS, "AWS_SHARED_CREDENTIALS_FILE"):
        if k not in extra:
            env.pop(k, None)
    return env


def test_write_to_s3_then_a_job_reads_the_shards(moto_store, s3_daemon, dataset, tmp_path, monkeypatch):
    moto = moto_store
    # The credentials from the shared credentials file (the trainer's), not the environment.
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = {moto.key_id}\naws_secret_access_key = {moto.secret}\n")
    env = moto_env(moto, tmp_path)
    r = run_tool(f"s3://{BUCKET}/written/train", "--folder", dataset.root, "--shard-size", 12, "--name", "train",
                 env=env)
    assert moto.secret not in r.stdout + r.stderr
    keys = sorted(o["Key"] for o in moto.s3.list_objects_v2(Bucket=BUCKET, Prefix="written/")["Contents"])
    assert keys == [f"written/train/train-00000{i}.tar" for i in range(4)] + ["written/train/train.manifest.json"]
    manifest = json.loads(moto.s3.get_object(Bucket=BUCKET, Key="written/train/train.manifest.json")["Body"].read())
    # The same bytes as a local run, and the manifest's checksums verify on what the store holds.
    local = tmp_path / "local"
    run_tool(local, "--folder", dataset.root, "--shard-size", 12, "--name", "train")
    assert json.loads((local / "train.manifest.json").read_text())["shards"] == manifest["shards"]
    for s in manifest["shards"]:
        body = moto.s3.get_object(Bucket=BUCKET, Key=f"written/train/{s['file']}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == s["sha256"] and body == (local / s["file"]).read_bytes()
    r = subprocess.run([sys.executable, str(TOOL), "verify", f"s3://{BUCKET}/written/train/train.manifest.json"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.startswith("ok: 4 shards, 48 samples"), r.stderr
    # A job reads them from the store with the trainer's credentials.
    use_trainer_credentials(monkeypatch, moto, tmp_path)
    recs = records(s3_daemon, job(f"{{type: tar, shards: 's3://{BUCKET}/written/train/{manifest['pattern']}'}}"))
    assert [(p, label) for p, label, _ in recs] == [(rel.rsplit(".", 1)[0], dataset.label_of[rel])
                                                   for rel in dataset.files]


def test_write_to_s3_with_bad_credentials_fails_clearly(moto_store, dataset, tmp_path):
    env = moto_env(moto_store, tmp_path, AWS_ACCESS_KEY_ID=moto_store.key_id,
                   AWS_SECRET_ACCESS_KEY="not-the-secret-" + "x" * 20)
    r = run_tool(f"s3://{BUCKET}/bad", "--folder", dataset.root, env=env, check=False)
    assert r.returncode == 1
    assert f"PUT s3://{BUCKET}/bad/shard-000000.tar: HTTP 403" in r.stderr, r.stderr
    assert "not-the-secret" not in r.stderr + r.stdout


class SlowDownProxy(Proxy):
    """An HTTP proxy to moto (127.0.0.1) that answers the first PUT of each path with 503 SlowDown
    (after reading its body) and forwards everything else; one request per connection."""

    def __init__(self, upstream_port: int) -> None:
        self.refused: dict = {}  # path -> 503s sent
        self.forwarded: dict = {}  # path -> PUTs forwarded
        super().__init__(upstream_port, backlog=16)

    def handle(self, conn) -> None:
        req = read_message(conn)
        if not req:
            return
        method, path = req.split(b" ", 2)[:2]
        path = path.decode()
        if method == b"PUT" and path not in self.refused:
            self.refused[path] = 1
            body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            conn.sendall(b"HTTP/1.1 503 Slow Down\r\nContent-Length: " + str(len(body)).encode() +
                         b"\r\nConnection: close\r\n\r\n" + body)
            return
        if method == b"PUT":
            self.forwarded[path] = self.forwarded.get(path, 0) + 1
        up = self.upstream()
        up.sendall(req)
        resp = read_message(up)
        up.close()
        conn.sendall(resp)


def test_write_to_s3_retries_a_503_and_lands_every_object_once(moto_store, dataset, tmp_path):
    moto = moto_store
    proxy = SlowDownProxy(moto.port)
    try:
        env = moto_env(moto, tmp_path, AWS_ACCESS_KEY_ID=moto.key_id, AWS_SECRET_ACCESS_KEY=moto.secret,
                       AWS_ENDPOINT_URL=proxy.url)
        run_tool(f"s3://{BUCKET}/retried", "--folder", dataset.root, "--shard-size", 20, env=env)
    finally:
        proxy.close()
    want = [f"/{BUCKET}/retried/shard-00000{i}.tar" for i in range(3)] + [f"/{BUCKET}/retried/shard.manifest.json"]
    assert sorted(proxy.refused) == want and sorted(proxy.forwarded) == want
    assert set(proxy.forwarded.values()) == {1}
    manifest = json.loads(moto.s3.get_object(Bucket=BUCKET, Key="retried/shard.manifest.json")["Body"].read())
    for s in manifest["shards"]:
        body = moto.s3.get_object(Bucket=BUCKET, Key=f"retried/{s['file']}")["Body"].read()
        assert hashlib.sha256(body).hexdigest() == s["sha256"]


def test_write_to_s3_with_temporary_credentials(moto_store, dataset, tmp_path):
    moto = moto_store
    tmp = moto.temporary_credentials("shard-writer", "write")
    env = moto_env(moto, tmp_path, AWS_ACCESS_KEY_ID=tmp["AccessKeyId"], AWS_SECRET_ACCESS_KEY=tmp["SecretAccessKey"],
                   AWS_SESSION_TOKEN=tmp["SessionToken"])
    run_tool(f"s3://{BUCKET}/temporary", "--folder", dataset.root, "--shard-size", 48, env=env)
    # Without the token the same key is refused.
    env.pop("AWS_SESSION_TOKEN")
    r = run_tool(f"s3://{BUCKET}/temporary2", "--folder", dataset.root, env=env, check=False)
    assert r.returncode == 1 and "HTTP 403" in r.stderr, r.stderr
    keys = [o["Key"] for o in moto.s3.list_objects_v2(Bucket=BUCKET, Prefix="temporary")["Contents"]]
    assert sorted(keys) == ["temporary/shard-000000.tar", "temporary/shard.manifest.json"]
