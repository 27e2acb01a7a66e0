"""Pixel parity with a PyTorch DataLoader, through the real daemon.

Real-content photographs (photos.py: 1/f colour fields, hard-edged shapes, texture and sensor
noise; ImageNet-sized) are written by PIL as JPEGs in 4:2:0, 4:2:2, 4:4:4 and grayscale. spdld's batches
are compared with what torchvision 0.14 makes of the same files on PIL images
(`Image.open(f).convert("RGB" | "L")`, then `F.resize`, `F.center_crop`, `F.resized_crop`):
shorter-side resize + centre crop, fixed-size resizes (down and up), a centre crop larger than the
image (zero padding), and random_resized_crop with the window the daemon draws (computed here from the
same seed: the port of media/sample_random + PlanRandomResizedCrop below), per interpolation mode;
JPEGs with EXIF Orientation tags 2..8 (decode.exif_orientation) against ImageOps.exif_transpose; and
PNGs (RGB, L, P, RGBA) and lossless WebP.

The default path (decode.resample: exact) must be within the issue's targets — mean absolute
difference <= 0.5 level and <= 4 levels at the 99.9th percentile — per mode and layout (it is
bit-exact where PIL uses the same libjpeg-turbo). The opt-in fast path's difference is measured and
printed (README "Pixels equal to PIL's"), with a loose bound that only catches breakage.
Run with -s to see the table.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image, ImageOps

import torchvision.transforms.functional as F
from torchvision.transforms import InterpolationMode

from photos import LAYOUTS, make_photo, save_photo

SIZES = [(500, 375), (385, 289), (375, 500), (640, 427)]  # ImageNet-like (width, height)
SEED = 11  # sampler.seed of every job
MODES = {
    "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC,
    "box": InterpolationMode.BOX,
    "nearest": InterpolationMode.NEAREST,
    "hamming": InterpolationMode.HAMMING,
    "lanczos": InterpolationMode.LANCZOS,
}
MAX_MEAN = 0.5
MAX_P999 = 4.0


@pytest.fixture(scope="module")
def photos(daemon):
    """root/c/<layout>_<n>.jpg for every layout and size; returns (root, sorted relative paths)."""
    root = daemon.tmp / "parity"
    folder = root / "c"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(2026)
    for layout in LAYOUTS:
        for n, (w, h) in enumerate(SIZES):
            save_photo(make_photo(rng, w, h), folder / f"{layout}_{n}.jpg", layout)
    files = sorted(f"c/{p.name}" for p in folder.iterdir())
    return root, files


# ---- the daemon's random window (media/sample_random.cc, media/image_ops.cc) -----------------

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_DOMAIN = 0x7370646C2D617567


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class _Rng:
    def __init__(self, sample_seed: int, stream: int):
        self.state = _mix((sample_seed + _GOLDEN * stream) & _MASK)

    def next(self) -> int:
        self.state = (self.state + _GOLDEN) & _MASK
        return _mix(self.state)

    def uniform(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * ((self.next() >> 11) * 2.0**-53)

    def uniform_int(self, lo: int, hi: int) -> int:
        return lo + ((self.next() * (hi - lo + 1)) >> 64)


def daemon_crop_window(index: int, width: int, height: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """(top, left, h, w) of the random resized crop the daemon draws for dataset sample `index` in epoch 0."""
    h0 = _mix(SEED ^ _DOMAIN)
    h0 = _mix((h0 + _GOLDEN + 0) & _MASK)
    rng = _Rng(_mix((h0 + _GOLDEN + index) & _MASK), 1)
    area = width * height
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(lo, hi))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            y = rng.uniform_int(0, height - h)
            x = rng.uniform_int(0, width - w)
            return y, x, h, w
    in_ratio = width / height
    w, h = width, height
    if in_ratio < ratio[0]:
        h = round(w / ratio[0])
    elif in_ratio > ratio[1]:
        w = round(h * ratio[1])
    w, h = min(max(w, 1), width), min(max(h, 1), height)
    return (height - h) // 2, (width - w) // 2, h, w


# ---- the comparison ----------------------------------------------------------------------------

# name: (transforms YAML, output size (h, w), torchvision on a PIL image: f(img, mode, index))
GEOMETRIES = {
    "shorter256_crop224": ("[{resize: {shorter: 256, interpolation: MODE}}, {center_crop: {size: 224}}]", (224, 224),
                           lambda img, m, i: F.center_crop(F.resize(img, 256, m), 224)),
    "fixed200x300": ("[{resize: {height: 200, width: 300, interpolation: MODE}}]", (200, 300),
                     lambda img, m, i: F.resize(img, [200, 300], m)),
    # No resize (MODE unused): a centre crop larger than the 385x289 photos pads them with zeros.
    "crop300_padded": ("[{center_crop: {size: 300}}]", (300, 300), lambda img, m, i: F.center_crop(img, 300)),
    "random_resized_crop224": ("[{random_resized_crop: {size: 224, interpolation: MODE}}]", (224, 224),
                               lambda img, m, i: F.resized_crop(img, *daemon_crop_window(i, *img.size), [224, 224], m)),
    "upscale_fixed600x800": ("[{resize: {height: 600, width: 800, interpolation: MODE}}]", (600, 800),
                             lambda img, m, i: F.resize(img, [600, 800], m)),
}

CASES = (
    [("shorter256_crop224", m, "rgb", "exact") for m in MODES]
    + [(g, m, "rgb", "exact") for g in ("fixed200x300", "random_resized_crop224") for m in ("bilinear", "bicubic", "box")]
    + [("crop300_padded", "bilinear", "rgb", "exact"), ("upscale_fixed600x800", "bicubic", "rgb", "exact")]
    + [("shorter256_crop224", m, "gray", "exact") for m in ("bilinear", "bicubic")]
    + [("random_resized_crop224", "bicubic", "gray", "exact")]
    + [("shorter256_crop224", m, "rgb", "fast") for m in ("bilinear", "bicubic", "box")]
    + [("random_resized_crop224", "bilinear", "rgb", "fast")]
)


def _stats(diff: np.ndarray) -> dict:
    d = diff.ravel()
    return {"mean": float(d.mean()), "p99": float(np.percentile(d, 99)), "p99.9": float(np.percentile(d, 99.9)),
            "max": int(d.max()), "exact": bool(d.max() == 0)}


def _fmt(s: dict) -> str:
    return f"mean {s['mean']:.3f} p99 {s['p99']:.0f} p99.9 {s['p99.9']:.0f} max {s['max']:3d}"


@pytest.mark.parametrize("geometry,mode,color,resample", CASES, ids=["-".join(c) for c in CASES])
def test_pixels_match_pil_and_torchvision(make_loader, photos, geometry, mode, color, resample):
    root, files = photos
    transforms, (oh, ow), reference = GEOMETRIES[geometry]
    channels = 1 if color == "gray" else 3
    config = (
        f"source: {{type: image_folder, root: {root}}}\n"
        f"sampler: {{shuffle: false, seed: {SEED}}}\n"
        f"batch: {{size: {len(files)}}}\n"
        f"decode: {{color: {color}, resample: {resample}}}\n"
        f"transforms: {transforms.replace('MODE', mode)}\n"
    )
    got = {}
    for batch in make_loader(config):
        images = np.from_dlpack(batch["image"])
        assert images.shape[1:] == (oh, ow, channels)
        for path, image in zip(batch.paths, images):
            got[path] = image.copy()
    assert sorted(got) == files
    per_layout = {}
    for index, path in enumerate(files):  # the dataset index is the sorted position
        img = Image.open(root / path).convert("L" if channels == 1 else "RGB")
        want = np.asarray(reference(img, MODES[mode], index)).reshape(oh, ow, channels)
        diff = np.abs(got[path].astype(np.int16) - want.astype(np.int16))
        per_layout.setdefault(path.split("/")[1].split("_")[0], []).append(diff)
    print()
    failures = []
    for layout, diffs in per_layout.items():
        s = _stats(np.stack(diffs))
        print(f"  parity {resample:5s} {geometry:26s} {mode:8s} {color:4s} {layout:4s}: {_fmt(s)}")
        if resample == "exact" and (s["mean"] > MAX_MEAN or s["p99.9"] > MAX_P999):
            failures.append(f"{layout}: {_fmt(s)}")
        # The fast path is close, not equal; this bound only catches a broken path (a misplaced
        # window, swapped channels), the README states the measured figures.
        if resample == "fast" and (s["mean"] > 6 or s["p99.9"] > 128):
            failures.append(f"{layout}: {_fmt(s)}")
    assert not failures, f"{geometry} {mode} {color} ({resample}) differs from PIL + torchvision: " + "; ".join(failures)


@pytest.fixture(scope="module")
def exif_photos(daemon):
    """JPEGs (4:2:0 and 4:4:4) whose EXIF Orientation tags (2..8) say how to turn them upright."""
    root = daemon.tmp / "parity_exif"
    folder = root / "c"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(8)
    for tag in range(2, 9):
        exif = Image.Exif()
        exif[0x0112] = tag
        for layout, sub in (("420", 2), ("444", 0)):
            make_photo(rng, 420, 300).save(folder / f"{layout}_o{tag}.jpg", quality=90, subsampling=sub,
                                           exif=exif.tobytes())
    return root, sorted(f"c/{p.name}" for p in folder.iterdir())


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_exif_orientation_matches_pil_exif_transpose(make_loader, exif_photos, mode):
    """decode.exif_orientation: the image is turned upright first, as ImageOps.exif_transpose, then the
    geometry: the same pixels."""
    root, files = exif_photos
    config = (
        f"source: {{type: image_folder, root: {root}}}\n"
        "sampler: {shuffle: false}\n"
        f"batch: {{size: {len(files)}}}\n"
        "decode: {exif_orientation: true}\n"
        f"transforms: [{{resize: {{shorter: 160, interpolation: {mode}}}}}, {{center_crop: {{size: [144, 128]}}}}]\n"
    )
    worst = 0
    for batch in make_loader(config):
        for path, image in zip(batch.paths, np.from_dlpack(batch["image"])):
            img = ImageOps.exif_transpose(Image.open(root / path)).convert("RGB")
            want = np.asarray(F.center_crop(F.resize(img, 160, MODES[mode]), [144, 128]))
            diff = np.abs(image.astype(np.int16) - want.astype(np.int16))
            worst = max(worst, int(diff.max()))
            assert diff.mean() <= MAX_MEAN and np.percentile(diff, 99.9) <= MAX_P999, path
    print(f"\n  parity exact exif_orientation 2..8 {mode}: max {worst}")


@pytest.fixture(scope="module")
def png_photos(daemon):
    """Lossless sources: PNGs in RGB, L, P (a 256-colour palette) and RGBA, and a lossless WebP."""
    root = daemon.tmp / "parity_png"
    folder = root / "c"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(9)
    for n, (w, h) in enumerate(SIZES[:2]):
        img = make_photo(rng, w, h)
        img.save(folder / f"rgb_{n}.png")
        img.convert("L").save(folder / f"l_{n}.png")
        img.quantize(256).save(folder / f"p_{n}.png")
        rgba = img.copy()
        rgba.putalpha(Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8)))
        rgba.save(folder / f"rgba_{n}.png")
        img.save(folder / f"webp_{n}.webp", lossless=True)
    return root, sorted(f"c/{p.name}" for p in folder.iterdir())


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_lossless_formats_match_pil(make_loader, png_photos, mode):
    """Other formats decode losslessly through FFmpeg, then the same resampler: PIL's pixels
    (convert("RGB") drops alpha and expands palettes, as decode.alpha: drop does)."""
    root, files = png_photos
    config = (
        f"source: {{type: image_folder, root: {root}, extensions: [.png, .webp]}}\n"
        "sampler: {shuffle: false}\n"
        f"batch: {{size: {len(files)}}}\n"
        f"transforms: [{{resize: {{shorter: 256, interpolation: {mode}}}}}, {{center_crop: {{size: 224}}}}]\n"
    )
    seen = 0
    for batch in make_loader(config):
        for path, image in zip(batch.paths, np.from_dlpack(batch["image"])):
            img = Image.open(root / path).convert("RGB")
            want = np.asarray(F.center_crop(F.resize(img, 256, MODES[mode]), 224))
            diff = np.abs(image.astype(np.int16) - want.astype(np.int16))
            print(f"\n  parity exact {path:20s} {mode}: mean {diff.mean():.3f} max {diff.max()}", end="")
            assert diff.max() == 0, path
            seen += 1
    assert seen == len(files)
