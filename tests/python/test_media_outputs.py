"""Media outputs through the real daemon, checked against references made here:
- decode.color: gray: every image arrives as one channel, [B, H, W, 1] / [B, 1, H, W], against
  PIL's convert("L") of the same files (written by PIL at test time);
- 16-bit PNGs (written by FFmpeg's CLI and by PIL) keep their 16 bits in float32 output: x / 65535;
- extra_outputs: a sidecar's bytes per sample ([B, max_bytes] uint8, zero-padded) plus
  `<name>_length` int32 [B], from WebDataset tar shards (.jpg + .txt, .wav + .txt, .mp4 + .txt) and
  from an image folder; missing and too long sidecars by policy; config errors with their lines. The tensors
  are read through numpy / torch.from_dlpack and spdl-client --json, with no special code.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile

import numpy as np
import pytest
from PIL import Image

import spdl_client
from conftest import BUILD

W, H = 48, 40  # every generated image has this size: resize to it is an identity


def _smooth_rgb(seed: int, w: int = W, h: int = H) -> np.ndarray:
    """A smooth colour image (gradients plus a soft blob): JPEG-friendly, no clipping."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 40 + 150 * x / w + 10 * np.sin(y / 5 + seed)
    g = 60 + 120 * y / h + 20 * np.cos(x / 7 + seed)
    b = 90 + 80 * np.exp(-((x - w / 2) ** 2 + (y - h / 2) ** 2) / (2 * (w / 4) ** 2)) + 5 * seed
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255).round().astype(np.uint8)


def _identity_job(root, *, extra: str = "", batch: int = 4, normalize: str = "") -> str:
    return (
        f"source: {{type: image_folder, root: {root}, extensions: [.jpg, .png]}}\n"  # 1
        "sampler: {shuffle: false}\n"                                                # 2
        f"batch: {{size: {batch}}}\n"                                                # 3
        "transforms:\n"                                                              # 4
        f"  - resize: {{height: {H}, width: {W}}}\n"                                 # 5
        + (f"  - normalize: {normalize}\n" if normalize else "")                     # 6
        + extra
    )


@pytest.fixture(scope="module")
def gray_root(daemon):
    """Colour JPEGs (4:2:0 and 4:4:4), colour PNGs, a gray PNG and a gray JPEG, written by PIL."""
    root = daemon.tmp / "gray" / "c"
    root.mkdir(parents=True, exist_ok=True)
    Image.fromarray(_smooth_rgb(1)).save(root / "a_rgb420.jpg", quality=92)
    Image.fromarray(_smooth_rgb(2)).save(root / "b_rgb444.jpg", quality=92, subsampling=0)
    Image.fromarray(_smooth_rgb(3)).save(root / "c_rgb.png")
    Image.fromarray(_smooth_rgb(4)).convert("L").save(root / "d_gray.png")
    Image.fromarray(_smooth_rgb(5)).convert("L").save(root / "e_gray.jpg", quality=92)
    Image.fromarray(np.dstack([_smooth_rgb(6), np.full((H, W), 128, np.uint8)])).save(root / "f_rgba.png")
    return root.parent


# Tolerances against PIL's convert("L") of PIL's own decode, in 8-bit levels. Lossless files: the
# same luma formula (ITU-R 601, full range), rounded once by each: at most 1 level. JPEGs: spdld
# takes libjpeg-turbo's grayscale output (the stored Y plane), PIL the luma of its RGB decode
# (upsampled chroma, colour conversion, two roundings): within 2 levels, 0.6 on average. Measured
# here: 0 difference for the JPEGs, at most 1 level (mean 0.005) for the colour PNGs.
GRAY_TOLERANCE = {".png": (1, 0.5), ".jpg": (2, 0.6)}


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_gray_output_is_one_channel_and_matches_pil_convert_l(make_loader, gray_root, layout):
    loader = make_loader(_identity_job(gray_root, batch=6, extra=f"decode: {{color: gray}}\noutput: {{layout: {layout}}}\n"),
                         epochs=1)
    shape = (6, H, W, 1) if layout == "NHWC" else (6, 1, H, W)
    assert [(t["name"], t["dtype"], t["shape"]) for t in loader.info["layout"]] == [
        ("image", "uint8", shape), ("label", "int64", (6,))]
    (batch,) = list(loader)
    images = np.from_dlpack(batch["image"])
    assert images.shape == shape
    for r, path in enumerate(batch.paths):
        got = images[r, :, :, 0] if layout == "NHWC" else images[r, 0]
        want = np.asarray(Image.open(gray_root / path).convert("L"))
        diff = np.abs(got.astype(int) - want.astype(int))
        max_err, mean_err = GRAY_TOLERANCE[path[-4:]]
        assert diff.max() <= max_err and diff.mean() <= mean_err, (path, diff.max(), diff.mean())


def test_gray_normalize_takes_one_mean_and_std(make_loader, gray_root):
    extra = ("decode: {color: gray}\n"
             "output: {dtype: float32, layout: NCHW}\n")
    config = _identity_job(gray_root, batch=6, extra=extra, normalize="{mean: [0.5], std: 0.25}")
    (batch,) = list(make_loader(config, epochs=1))
    x = np.from_dlpack(batch["image"])
    assert x.dtype == np.float32 and tuple(x.shape) == (6, 1, H, W)
    u8 = np.from_dlpack(next(iter(make_loader(_identity_job(gray_root, batch=6, extra="decode: {color: gray}\n"),
                                              epochs=1)))["image"])
    np.testing.assert_allclose(x[:, 0], (u8[..., 0] / 255.0 - 0.5) / 0.25, atol=1e-5)

    # Three values for one channel: refused, with the line.
    bad = _identity_job(gray_root, extra="decode: {color: gray}\noutput: {dtype: float32}\n",
                        normalize="{mean: [0.5, 0.5, 0.5], std: [0.2, 0.2, 0.2]}")
    with pytest.raises(spdl_client.SpdlError) as err:
        make_loader(bad)
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 2 and all(re.match(r"<config>:6:\d+: .*gray gives one channel", l) for l in lines), lines


def _rgb48(seed: int) -> np.ndarray:
    """16-bit RGB values that are not multiples of 257 (so 8 bits cannot hold them)."""
    y, x = np.mgrid[0:H, 0:W].astype(np.int64)
    planes = [(x * 1361 + y * 17 + 7 * seed) % 65536, (y * 1601 + x * 3 + 11) % 65536, (x * y * 29 + 12345) % 65536]
    return np.stack(planes, axis=-1).astype(np.uint16)


@pytest.fixture(scope="module")
def png16_root(daemon):
    """A 16-bit RGB PNG written by FFmpeg's CLI from raw rgb48le, a 16-bit gray PNG written by PIL."""
    root = daemon.tmp / "png16" / "c"
    root.mkdir(parents=True, exist_ok=True)
    rgb = _rgb48(1)
    raw = root.parent / "rgb48.raw"
    raw.write_bytes(rgb.astype("<u2").tobytes())
    subprocess.run(["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-f", "rawvideo",
                    "-pix_fmt", "rgb48le", "-s", f"{W}x{H}", "-i", str(raw), "-frames:v", "1",
                    "-pix_fmt", "rgb48be", str(root / "a_rgb48.png")], check=True)
    gray = _rgb48(2)[..., 0]
    Image.fromarray(gray.astype(np.uint16)).save(root / "b_gray16.png")  # mode I;16 (the "mode=" argument is gone from newer Pillow)
    return root.parent, {"c/a_rgb48.png": rgb, "c/b_gray16.png": gray}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_16bit_png_keeps_its_precision_in_floating_point_output(make_loader, png16_root, dtype):
    root, values = png16_root
    loader = make_loader(_identity_job(root, batch=2, extra=f"output: {{dtype: {dtype}}}\n"), epochs=1)
    (batch,) = list(loader)
    if dtype == "bfloat16":  # numpy has no bfloat16: through torch
        torch = pytest.importorskip("torch", reason="bfloat16 output is read through torch, not installed here")
        images = np.asarray(torch.from_dlpack(batch["image"]).to(torch.float64).tolist())
    else:
        images = np.from_dlpack(batch["image"]).astype(np.float64)
    for r, path in enumerate(batch.paths):
        src = values[path]
        want = (src if src.ndim == 3 else np.repeat(src[..., None], 3, axis=-1)) / 65535.0
        got = images[r]
        if dtype == "float32":
            # x / 65535 at float32 precision: every 16-bit value comes back exactly.
            assert np.array_equal(np.round(got * 65535), np.round(want * 65535)), path
            assert np.abs(got - want).max() < 1e-6, path
        else:
            # One rounding to the 16-bit float type (11 or 8 significant bits).
            rel = 2.0 ** -11 if dtype == "float16" else 2.0 ** -8
            assert (np.abs(got - want) <= rel * np.maximum(want, 2.0 ** -14) + 1e-12).all(), path
    # uint8 output reads the 8-bit path as before: swscale's 16 -> 8 bit, the high byte (as PIL's
    # v >> 8) within one level.
    (u8,) = list(make_loader(_identity_job(root, batch=2), epochs=1))
    arr = np.from_dlpack(u8["image"]).astype(np.int64)
    for r, path in enumerate(u8.paths):
        src = values[path]
        want = (src if src.ndim == 3 else np.repeat(src[..., None], 3, axis=-1)).astype(np.int64)
        assert np.abs(arr[r] - (want >> 8)).max() <= 1, path


def test_16bit_gray_png_to_gray_float(make_loader, png16_root):
    root, values = png16_root
    (batch,) = list(make_loader(_identity_job(root, batch=2, extra="decode: {color: gray}\noutput: {dtype: float32}\n"),
                                epochs=1))
    images = np.from_dlpack(batch["image"])
    r = batch.paths.index("c/b_gray16.png")
    assert np.array_equal(np.round(images[r, :, :, 0].astype(np.float64) * 65535).astype(np.int64),
                          values["c/b_gray16.png"].astype(np.int64))


# ---- extra outputs: sidecar bytes per sample ----

TEXTS = {
    "000000": b"hello",
    "000001": b"",                      # an empty sidecar: length 0
    "000002": "na\u00efve caf\u00e9 \u2014 utf-8".encode(),
    "000003": b"x" * 40,                # longer than max_bytes 32
    "000004": None,                     # no sidecar at all
    "000005": b"\x00binary\xffbytes",
}
MAX = 32


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def jpg_txt_shard(daemon):
    path = daemon.tmp / "extra" / "images-000.tar"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for i, (key, text) in enumerate(TEXTS.items()):
            jpeg = io.BytesIO()
            Image.fromarray(_smooth_rgb(i)).save(jpeg, format="JPEG", quality=90)
            _add(tar, f"{key}.jpg", jpeg.getvalue())
            _add(tar, f"{key}.cls", str(i % 2).encode())
            if text is not None:
                _add(tar, f"{key}.txt", text)
    return path


def _tar_job(shard, *, extra_outputs: str, media: str = "", batch: int = 6, on_error: str = "skip") -> str:
    body = media or "transforms:\n  - resize: {height: 16, width: 16}\n"
    return (
        f"source: {{type: tar, shards: {shard}, shuffle_buffer: 1}}\n"
        "sampler: {shuffle: false}\n"
        f"batch: {{size: {batch}}}\n"
        f"on_error: {on_error}\n"
        f"{body}"
        f"extra_outputs:\n{extra_outputs}"
    )


def _want(text, *, truncate: bool = True):
    if text is None:
        return b""
    return text[:MAX] if truncate else text


def test_tar_sidecars_arrive_as_bytes_and_lengths(make_loader, jpg_txt_shard):
    extra = f"  - {{name: transcript, from: .txt, max_bytes: {MAX}, on_missing: empty, on_overflow: truncate}}\n"
    loader = make_loader(_tar_job(jpg_txt_shard, extra_outputs=extra), epochs=1)
    assert [(t["name"], t["dtype"], t["shape"]) for t in loader.info["layout"]] == [
        ("image", "uint8", (6, 16, 16, 3)), ("label", "int64", (6,)),
        ("transcript", "uint8", (6, MAX)), ("transcript_length", "int32", (6,))]
    (batch,) = list(loader)
    data = np.from_dlpack(batch["transcript"])
    lengths = np.from_dlpack(batch["transcript_length"])
    assert data.dtype == np.uint8 and lengths.dtype == np.int32
    assert batch.paths == list(TEXTS)
    for r, key in enumerate(batch.paths):
        want = _want(TEXTS[key])
        assert int(lengths[r]) == len(want), key
        assert bytes(data[r, : len(want)]) == want, key
        assert not data[r, len(want):].any(), key  # zero padding
    assert batch.labels == [i % 2 for i in range(6)]


def test_missing_and_too_long_sidecars_follow_the_policy(make_loader, jpg_txt_shard):
    # on_missing: error with on_error: skip: the sample without a .txt is skipped and counted.
    extra = f"  - {{name: transcript, from: .txt, max_bytes: {MAX}, on_overflow: truncate}}\n"
    loader = make_loader(_tar_job(jpg_txt_shard, extra_outputs=extra, batch=5), epochs=1)
    batches = list(loader)
    assert [p for b in batches for p in b.paths] == [k for k, t in TEXTS.items() if t is not None]
    assert loader.stats()["skipped"] == 1

    # on_overflow: error with on_error: fail: the job fails naming the sample and the limit.
    extra = f"  - {{name: transcript, from: .txt, max_bytes: {MAX}, on_missing: empty}}\n"
    loader = make_loader(_tar_job(jpg_txt_shard, extra_outputs=extra, on_error="fail"), epochs=1)
    with pytest.raises(spdl_client.SpdlError) as err:
        list(loader)
    assert "000003" in str(err.value) and "40 bytes" in str(err.value) and f"max_bytes {MAX}" in str(err.value)

    # on_missing: error with on_error: fail: the job fails naming the sample and the member.
    extra = f"  - {{name: transcript, from: .txt, max_bytes: 64}}\n"
    loader = make_loader(_tar_job(jpg_txt_shard, extra_outputs=extra, on_error="fail"), epochs=1)
    with pytest.raises(spdl_client.SpdlError) as err:
        list(loader)
    assert "000004" in str(err.value) and "no .txt member" in str(err.value)


def test_audio_with_transcripts_from_a_tar_shard(make_loader, daemon):
    path = daemon.tmp / "extra" / "speech-000.tar"
    path.parent.mkdir(parents=True, exist_ok=True)
    words = {"utt_a": b"the cat sat", "utt_b": b"on the mat", "utt_c": b"hello world again"}
    with tarfile.open(path, "w") as tar:
        for i, (key, text) in enumerate(words.items()):
            wav = subprocess.run(
                ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i",
                 f"sine=frequency={300 + 100 * i}:sample_rate=16000:duration=0.2", "-c:a", "pcm_s16le",
                 "-f", "wav", "-"], check=True, stdout=subprocess.PIPE).stdout
            _add(tar, f"{key}.wav", wav)
            _add(tar, f"{key}.txt", text)
    media = "media: audio\naudio: {sample_rate: 16000, length: 4000}\n"
    extra = "  - {name: text, from: .txt, max_bytes: 24}\n"
    loader = make_loader(_tar_job(path, extra_outputs=extra, media=media, batch=3), epochs=1)
    assert [t["name"] for t in loader.info["layout"]] == ["audio", "length", "label", "text", "text_length"]
    (batch,) = list(loader)
    arrays = batch.numpy()
    for r, key in enumerate(batch.paths):
        n = int(arrays["text_length"][r])
        assert bytes(arrays["text"][r, :n]) == words[key] and not arrays["text"][r, n:].any()
    assert arrays["length"].tolist() == [3200, 3200, 3200]


def test_folder_sidecars_and_spdl_client_json(make_loader, daemon):
    root = daemon.tmp / "sidecar_folder"
    texts = {"cat/img_0.jpg": b"a cat", "cat/img_1.jpg": b"another cat, longer", "dog/img_0.jpg": None}
    for i, (rel, text) in enumerate(texts.items()):
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_smooth_rgb(i)).save(f, quality=90)
        if text is not None:
            f.with_suffix(".caption").write_bytes(text)
    config = _identity_job(root, batch=3, extra="extra_outputs: [{name: caption, from: .caption, max_bytes: 16, "
                                                "on_missing: empty, on_overflow: truncate}]\n")
    (batch,) = list(make_loader(config, epochs=1))
    caption = batch.numpy()["caption"]
    lengths = batch.numpy()["caption_length"]
    for r, rel in enumerate(batch.paths):
        want = (texts[rel] or b"")[:16]
        assert int(lengths[r]) == len(want) and bytes(caption[r, : len(want)].tolist()) == want, rel

    # The command-line client takes the same job and reports it (the batch has 4 tensors).
    job = root.parent / "sidecar_job.yaml"
    job.write_text(config)
    out = subprocess.run([str(BUILD / "bin" / "spdl-client"), "--socket", daemon.socket, "--config", str(job),
                          "--epochs", "1", "--json"], check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    assert report["samples"] == 3 and report["batches"] == 1


def test_extra_output_config_errors_have_lines(make_loader, jpg_txt_shard):
    bad = _tar_job(jpg_txt_shard, extra_outputs=(
        "  - {name: label, from: .txt, max_bytes: 8}\n"        # 8: a name the batch has
        "  - {name: caption, from: txt, max_bytes: 0}\n"       # 9: no '.', max_bytes < 1
        "  - {name: caption2, from: .txt, on_missing: skip}\n"  # 10: no max_bytes, bad choice
    ))
    with pytest.raises(spdl_client.SpdlError) as err:
        make_loader(bad)
    lines = str(err.value).splitlines()
    got = [int(re.match(r"<config>:(\d+):\d+: ", l).group(1)) for l in lines[1:]]
    assert got == [8, 9, 9, 10, 10], str(err.value)
    assert "already has a tensor 'label'" in lines[1]


def test_video_with_captions_from_a_tar_shard(make_loader, daemon, tmp_path):
    path = daemon.tmp / "extra" / "clips-000.tar"
    path.parent.mkdir(parents=True, exist_ok=True)
    captions = {"clip_a": b"a test pattern", "clip_b": None}
    with tarfile.open(path, "w") as tar:
        for i, (key, text) in enumerate(captions.items()):
            mp4 = tmp_path / f"{key}.mp4"
            subprocess.run(["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                            f"testsrc=size=64x48:rate=10:duration=1", "-c:v", "libx264", "-pix_fmt", "yuv420p",
                            str(mp4)], check=True)
            _add(tar, f"{key}.mp4", mp4.read_bytes())
            if text is not None:
                _add(tar, f"{key}.txt", text)
    media = "media: video\nvideo: {frames: 2, height: 24, width: 32}\n"
    extra = "  - {name: caption, from: .txt, max_bytes: 20, on_missing: empty}\n"
    loader = make_loader(_tar_job(path, extra_outputs=extra, media=media, batch=2), epochs=1)
    (batch,) = list(loader)
    arrays = batch.numpy()
    assert arrays["video"].shape == (2, 2, 24, 32, 3) and arrays["caption"].shape == (2, 20)
    for r, key in enumerate(batch.paths):
        want = captions[key] or b""
        assert int(arrays["caption_length"][r]) == len(want) and bytes(arrays["caption"][r, : len(want)]) == want
