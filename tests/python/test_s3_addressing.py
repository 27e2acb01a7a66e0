"""Object storage loose ends against a real S3 server (moto on 127.0.0.1, signature checks on) and
a real spdld: virtual-hosted addressing end to end (the bucket in the Host header: libcurl resolves
every *.localhost name to 127.0.0.1, so http://spdl-test.localhost:PORT reaches moto on loopback and
moto reads the bucket from the host), and mask sidecars of s3:// tar shards, pixel-exact as for
local shards. No test touches an address other than 127.0.0.1."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import spdl_client
from conftest import SpdldProcess
from s3_server import BUCKET, Moto, make_tar, require_moto, use_trainer_credentials

require_moto()

N = 6


def _shard() -> tuple:
    """A tar shard of N samples: KEY.jpg, KEY.cls (label), KEY.png (an 8-bit mask of the image's size)."""
    rng = np.random.default_rng(4)
    masks, labels = {}, {}
    members = []
    for i in range(N):
        w, h = 40 + 4 * i, 30 + 2 * i
        key = f"m/{i:04d}"
        img = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(img, format="JPEG", quality=90)
        m = rng.integers(0, 7, size=(h, w), dtype=np.uint8)
        png = io.BytesIO()
        Image.fromarray(m, mode="L").save(png, format="PNG")
        masks[key], labels[key] = m, i % 3
        members += [(key + ".jpg", img.getvalue()), (key + ".cls", str(i % 3).encode()),
                    (key + ".png", png.getvalue())]
    return make_tar(members), masks, labels


@pytest.fixture(scope="module")
def vstore(tmp_root):
    (tmp_root / "vmoto").mkdir(exist_ok=True)
    with Moto(tmp_root / "vmoto") as moto:
        data, masks, labels = _shard()
        moto.s3.put_object(Bucket=BUCKET, Key="vshards/shard-0.tar", Body=data)
        yield moto, masks, labels


@pytest.fixture(scope="module")
def vdaemon(tmp_root, vstore):
    """A spdld allowed only the virtual-hosted URL of the bucket (http://spdl-test.localhost:PORT):
    a path-style request (http://127.0.0.1:PORT/spdl-test/...) would be refused by its prefixes."""
    moto = vstore[0]
    d = SpdldProcess(tmp_root, "s3v", [f"http://{BUCKET}.localhost:{moto.port}"], io_threads=2)
    yield d.sock
    d.stop()


@pytest.fixture
def vcreds(vstore, monkeypatch, tmp_path):
    moto = vstore[0]
    # Virtual-hosted: the client addresses bucket.localhost.
    use_trainer_credentials(monkeypatch, moto, tmp_path, endpoint=f"http://localhost:{moto.port}")
    return moto


def _job(addressing: str, extra: str = "") -> str:
    return (f"source: {{type: tar, shards: 's3://{BUCKET}/vshards/shard-0.tar', extensions: [.jpg], "
            f"s3: {{addressing: {addressing}}}}}\n"
            f"sampler: {{shuffle: false}}\nbatch: {{size: {N}}}\non_error: fail\n"
            "transforms:\n  - center_crop: {size: [24, 36]}\n  - horizontal_flip: {p: 1.0}\n" + extra)


def test_virtual_hosted_addressing_end_to_end(vdaemon, vstore, vcreds, tmp_root):
    moto, _, labels = vstore
    before = (tmp_root / "vmoto" / "moto.log").read_text(errors="replace")
    with spdl_client.Loader(_job("virtual"), socket=vdaemon, epochs=1, timeout=60) as loader:
        got = [(p, int(lbl)) for b in loader for p, lbl in zip(b.paths, b.labels)]
    assert sorted(got) == sorted(labels.items())
    # moto saw the object by its virtual-hosted path (the bucket in the Host header, not the path).
    seen = (tmp_root / "vmoto" / "moto.log").read_text(errors="replace")[len(before):]
    assert "GET /vshards/shard-0.tar" in seen, seen[-2000:]
    assert f"/{BUCKET}/vshards/shard-0.tar" not in seen
    # The same job path-style is refused by the daemon's prefixes: the addressing is what reached moto.
    with pytest.raises(spdl_client.SpdlError, match="not below any of the daemon's allowed_url_prefixes"):
        spdl_client.Loader(_job("path"), socket=vdaemon, epochs=1, timeout=30)


def test_mask_sidecars_of_s3_tar_shards(vdaemon, vstore, vcreds):
    """mask: {from: .png} on s3:// shards: each sample's .png member, cropped and flipped with it."""
    _, masks, _ = vstore
    with spdl_client.Loader(_job("virtual", "mask: {from: .png}\n"), socket=vdaemon, epochs=1, timeout=60) as loader:
        (batch,) = list(loader)
        got = np.from_dlpack(batch["mask"]).copy()
        paths = list(batch.paths)
    assert got.shape == (N, 24, 36)
    for r, path in enumerate(paths):
        m = masks[path]
        h, w = m.shape
        oy, ox = round((h - 24) / 2), round((w - 36) / 2)
        np.testing.assert_array_equal(got[r], m[oy:oy + 24, ox:ox + 36][:, ::-1], err_msg=path)


def test_a_mix_of_s3_shards_and_a_local_folder(vdaemon, vstore, vcreds, tmp_root):
    """sources: an s3:// tar shard (virtual-hosted) and a local image folder, 1 : 1 over 12 draws:
    each sample of both exactly once, interleaved, and the per-source counts in the stats."""
    _, _, labels = vstore
    local = tmp_root / "vlocal" / "cls"
    local.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(8)
    for i in range(N):
        Image.fromarray(rng.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)).save(local / f"{i}.jpg", quality=90)
    cfg = (f"sources:\n  - {{type: tar, shards: 's3://{BUCKET}/vshards/shard-0.tar', extensions: [.jpg], "
           f"s3: {{addressing: virtual}}, weight: 1}}\n"
           f"  - {{type: image_folder, root: {tmp_root / 'vlocal'}, weight: 1}}\n"
           "sampler: {seed: 4}\nbatch: {size: 4}\non_error: fail\n"
           "transforms:\n  - center_crop: {size: [24, 36]}\n")
    with spdl_client.Loader(cfg, socket=vdaemon, epochs=1, timeout=60) as loader:
        got = [(p, int(lbl)) for b in loader for p, lbl in zip(b.paths, b.labels)]
        stats = loader.stats()
    want = sorted(list(labels.items()) + [(f"cls/{i}.jpg", 0) for i in range(N)])
    assert sorted(got) == want
    first_half = [p for p, _ in got[:N]]
    assert any(p.startswith("cls/") for p in first_half) and any(p.startswith("m/") for p in first_half)
    assert stats["values"]["source_samples.0"] == N and stats["values"]["source_samples.1"] == N
