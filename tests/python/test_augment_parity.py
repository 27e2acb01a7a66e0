"""Pixel parity of spdld's augmentations (daemon/media/augment.h) with torchvision 0.14 on PIL images.

Each op runs with its random parameters pinned (a fixed factor, angle, kernel...) through
bin/augment_apply (the op's pure function) and through torchvision.transforms.functional on the same
decoded photo-like JPEG; the uint8 results must be within 1 level mean absolute difference and 3
levels at the 99.9th percentile. The figures are printed (pytest -s, or in the -rA summary).
The random draws (config -> parameters) are tested in tests/unit/augment_test.cc.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import torchvision.transforms.functional as F
from torchvision.transforms import InterpolationMode

from photos import make_photo

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SPDL_BUILD_DIR") or REPO / "build").resolve()
TOOL = BUILD / "bin" / "augment_apply"
NEAREST, BILINEAR, BICUBIC = 0, 1, 2
MODES = {NEAREST: InterpolationMode.NEAREST, BILINEAR: InterpolationMode.BILINEAR, BICUBIC: InterpolationMode.BICUBIC}


@pytest.fixture(scope="module")
def photos():
    if not TOOL.is_file():
        pytest.fail(f"{TOOL} is missing: build the augment_apply target")
    out = []
    with tempfile.TemporaryDirectory() as d:
        for i, (w, h) in enumerate([(224, 224), (257, 193)]):
            path = Path(d) / f"p{i}.jpg"
            make_photo(np.random.default_rng(100 + i), w, h).save(path, quality=90)
            with Image.open(path) as im:
                out.append(im.convert("RGB"))
    return out


def spdld(img: Image.Image, *args) -> np.ndarray:
    a = np.asarray(img)
    c = 1 if a.ndim == 2 else a.shape[2]
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "in.raw", Path(d) / "out.raw"
        src.write_bytes(np.ascontiguousarray(a).tobytes())
        subprocess.run([str(TOOL), str(src), str(a.shape[1]), str(a.shape[0]), str(c), str(dst)] + [str(x) for x in args],
                       check=True)
        out = np.frombuffer(dst.read_bytes(), dtype=np.uint8)
        return out.reshape(a.shape) if out.size == a.size else out  # padcrop: reshaped by the caller


# (id, spdld args, torchvision function of a PIL image)
CASES = [
    ("brightness_0.6", ["brightness", 0.6], lambda im: F.adjust_brightness(im, 0.6)),
    ("brightness_1.4", ["brightness", 1.4], lambda im: F.adjust_brightness(im, 1.4)),
    ("contrast_0.5", ["contrast", 0.5], lambda im: F.adjust_contrast(im, 0.5)),
    ("contrast_1.7", ["contrast", 1.7], lambda im: F.adjust_contrast(im, 1.7)),
    ("saturation_0.3", ["saturation", 0.3], lambda im: F.adjust_saturation(im, 0.3)),
    ("saturation_1.8", ["saturation", 1.8], lambda im: F.adjust_saturation(im, 1.8)),
    ("hue_-0.3", ["hue", -0.3], lambda im: F.adjust_hue(im, -0.3)),
    ("hue_0.1", ["hue", 0.1], lambda im: F.adjust_hue(im, 0.1)),
    ("hue_0.45", ["hue", 0.45], lambda im: F.adjust_hue(im, 0.45)),
    ("sharpness_0.1", ["sharpness", 0.1], lambda im: F.adjust_sharpness(im, 0.1)),
    ("sharpness_1.9", ["sharpness", 1.9], lambda im: F.adjust_sharpness(im, 1.9)),
    ("posterize_3", ["posterize", 3], lambda im: F.posterize(im, 3)),
    ("solarize_128", ["solarize", 128], lambda im: F.solarize(im, 128)),
    ("solarize_178.5", ["solarize", 178.5], lambda im: F.solarize(im, 178.5)),
    ("equalize", ["equalize"], F.equalize),
    ("autocontrast", ["autocontrast"], F.autocontrast),
    ("invert", ["invert"], F.invert),
    ("grayscale", ["grayscale"], lambda im: F.rgb_to_grayscale(im, 3)),
    ("gaussian_blur_5x3", ["blur", 5, 3, 1.3, 0.7], lambda im: F.gaussian_blur(im, [5, 3], [1.3, 0.7])),
    ("gaussian_blur_23", ["blur", 23, 23, 2.0, 2.0], lambda im: F.gaussian_blur(im, [23, 23], [2.0, 2.0])),
    ("vertical_flip", ["vflip"], F.vflip),
    ("rotate_23_nearest", ["rotate", 23, NEAREST], lambda im: F.rotate(im, 23, InterpolationMode.NEAREST)),
    ("rotate_-131_bilinear", ["rotate", -131, BILINEAR], lambda im: F.rotate(im, -131, InterpolationMode.BILINEAR)),
    ("rotate_90_nearest", ["rotate", 90, NEAREST], lambda im: F.rotate(im, 90, InterpolationMode.NEAREST)),
    ("rotate_12_bicubic", ["rotate", 12, BICUBIC], lambda im: F.rotate(im, 12, InterpolationMode.BICUBIC)),
]
for mode in (NEAREST, BILINEAR, BICUBIC):
    CASES.append((f"affine_{MODES[mode].value}", ["affine", 17, 5, -3, 1.1, 8, -4, mode],
                  lambda im, m=mode: F.affine(im, 17, [5, -3], 1.1, [8, -4], MODES[m])))
# The policies' shear (center [0, 0], angle atan(magnitude)) and translate.
CASES.append(("policy_shear_x", ["affine", 0, 0, 0, 1, 16.7, 0, NEAREST, 0, 0],
              lambda im: F.affine(im, 0.0, [0, 0], 1.0, [16.7, 0.0], InterpolationMode.NEAREST, center=[0, 0])))
CASES.append(("policy_translate_y", ["affine", 0, 0, -30, 1, 0, 0, NEAREST],
              lambda im: F.affine(im, 0.0, [0, -30], 1.0, [0.0, 0.0], InterpolationMode.NEAREST)))


# random_crop: pad, then crop the window (the padded image is in_w + left + right wide).
def _padcrop(im, pad, x, y, w, h, mode, fill):
    return F.crop(F.pad(im, pad, fill=fill, padding_mode=mode), y, x, h, w)


for mode_id, mode in enumerate(["constant", "edge", "reflect", "symmetric"]):
    CASES.append((f"random_crop_pad_{mode}", ["padcrop", 4, 6, 3, 9, 200, 150, mode_id, 17],
                  lambda im, m=mode: _padcrop(im, [4, 6, 5, 2], 3, 9, 200, 150, m, 17)))


def stats(a: np.ndarray, b: np.ndarray) -> tuple[float, float, int]:
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float(d.mean()), float(np.percentile(d, 99.9)), int(d.max())


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("color", ["rgb", "gray"])
def test_augment_matches_torchvision(photos, case, color):
    name, args, ref = case
    if color == "gray" and args[0] in ("saturation", "hue", "grayscale"):
        pytest.skip(f"{args[0]} leaves a gray (L) image unchanged in torchvision: checked for rgb only")
    worst = (0.0, 0.0, 0)
    for img in photos:
        if color == "gray":
            img = img.convert("L")
        ours = spdld(img, *args)
        theirs = np.asarray(ref(img))
        if args[0] == "padcrop":
            ours = ours.reshape(theirs.shape)
        assert ours.shape == theirs.shape
        s = stats(ours, theirs)
        worst = max(worst, s)
        assert s[0] <= 1.0 and s[1] <= 3.0, f"{name} {color}: mean {s[0]:.4f}, p99.9 {s[1]:.1f}, max {s[2]}"
    print(f"parity {name} {color}: mean abs diff {worst[0]:.4f}, p99.9 {worst[1]:.1f}, max {worst[2]}")
