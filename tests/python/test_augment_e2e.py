"""The built-in augmentations through a real spdld: pixels of pinned ops equal to torchvision on PIL,
random ones deterministic per (seed, epoch, sample), exact across a resume, timed in the job's stats
(`aug:NAME` rows, as `spdlctl stats` shows them). Op-by-op parity figures: test_augment_parity.py."""

from __future__ import annotations

import itertools
import json
import subprocess

import numpy as np
import pytest
from PIL import Image

import torchvision.transforms.functional as F
from torchvision.transforms import InterpolationMode

from conftest import BUILD

SPDLCTL = BUILD / "bin" / "spdlctl"


def config(root, augment: str, *, seed: int = 5, batch: int = 16, extra: str = "") -> str:
    return (
        f"source: {{type: image_folder, root: {root}}}\n"
        f"sampler: {{shuffle: false, seed: {seed}}}\n"
        f"batch: {{size: {batch}}}\n"
        "transforms:\n"
        "  - resize: {shorter: 64}\n"
        "  - center_crop: {size: 56}\n"
        f"{augment}"
        f"{extra}"
    )


def base(root, path) -> Image.Image:
    return F.center_crop(F.resize(Image.open(root / path).convert("RGB"), 64), 56)


# Ops whose random parameters are pinned by the config (a one-point range, p: 1).
PINNED = [
    ("sharpness", "  - sharpness: {sharpness_factor: 1.7, p: 1}\n", lambda im: F.adjust_sharpness(im, 1.7)),
    ("hue", "  - color_jitter: {hue: [0.2, 0.2]}\n", lambda im: F.adjust_hue(im, 0.2)),
    ("contrast", "  - color_jitter: {contrast: [0.6, 0.6]}\n", lambda im: F.adjust_contrast(im, 0.6)),
    ("equalize", "  - equalize: {p: 1}\n", F.equalize),
    ("grayscale", "  - grayscale: {p: 1}\n", lambda im: F.rgb_to_grayscale(im, 3)),
    ("vertical_flip", "  - vertical_flip: {p: 1}\n", F.vflip),
    ("blur", "  - gaussian_blur: {kernel_size: 5, sigma: 1.5}\n", lambda im: F.gaussian_blur(im, [5, 5], [1.5, 1.5])),
    ("rotate", "  - rotate: {degrees: [30, 30], interpolation: bilinear, fill: 7}\n",
     lambda im: F.rotate(im, 30, InterpolationMode.BILINEAR, fill=[7, 7, 7])),
    ("affine", "  - affine: {degrees: [10, 10], scale: [1.2, 1.2], shear: [5, 5]}\n",
     lambda im: F.affine(im, 10.0, [0, 0], 1.2, [5.0, 0.0], InterpolationMode.NEAREST)),
]


@pytest.mark.parametrize("name,augment,reference", PINNED, ids=[p[0] for p in PINNED])
def test_pinned_augmentation_through_the_daemon_equals_torchvision(make_loader, dataset, name, augment, reference):
    got = {}
    for batch in make_loader(config(dataset.root, augment), epochs=1):
        for path, image in zip(batch.paths, np.from_dlpack(batch["image"])):
            got[path] = image.copy()
    assert sorted(got) == sorted(dataset.files)
    diffs = [np.abs(got[p].astype(np.int16) - np.asarray(reference(base(dataset.root, p))).astype(np.int16))
             for p in dataset.files]
    d = np.stack(diffs)
    mean, p999 = float(d.mean()), float(np.percentile(d, 99.9))
    print(f"daemon parity {name}: mean abs diff {mean:.4f}, p99.9 {p999:.1f}, max {int(d.max())}")
    assert mean <= 1.0 and p999 <= 3.0


RECIPE = (
    "  - horizontal_flip: {p: 0.5}\n"
    "  - rand_augment: {num_ops: 2, magnitude: 9}\n"
    "  - color_jitter: {brightness: 0.4, contrast: 0.4, saturation: 0.4, hue: 0.1, p: 0.8}\n"
    "  - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}\n"
    "  - random_erasing: {p: 0.5, value: random}\n"
)
FLOAT = "output: {dtype: float32, layout: NCHW}\n"


def images(loader, limit=None):
    """(paths, image array) per batch: one epoch, or its first `limit` batches (taking no more)."""
    return [(list(b.paths), np.from_dlpack(b["image"]).copy()) for b in itertools.islice(iter(loader), limit)]


def test_random_augmentations_are_deterministic_and_vary_by_seed_and_epoch(make_loader, dataset):
    a = make_loader(config(dataset.root, RECIPE, extra=FLOAT))
    b = make_loader(config(dataset.root, RECIPE, extra=FLOAT))
    first_a, first_b = images(a), images(b)
    assert all(pa == pb and np.array_equal(ia, ib) for (pa, ia), (pb, ib) in zip(first_a, first_b))
    second_a = images(a)  # epoch 1: new draws for the same (unshuffled) samples
    assert not all(np.array_equal(i0, i1) for (_, i0), (_, i1) in zip(first_a, second_a))
    other = images(make_loader(config(dataset.root, RECIPE, seed=6, extra=FLOAT)))
    assert not all(np.array_equal(i0, i1) for (_, i0), (_, i1) in zip(first_a, other))
    plain = images(make_loader(config(dataset.root, "  - normalize: {mean: [0.485, 0.456, 0.406], "
                                      "std: [0.229, 0.224, 0.225]}\n", extra=FLOAT)))
    changed = np.mean([float(np.mean(i0 != i1)) for (_, i0), (_, i1) in zip(first_a, plain)])
    assert changed > 0.3  # the recipe changes most values


def test_augmented_job_resumes_exactly(make_loader, dataset):
    cfg = config(dataset.root, RECIPE, batch=8, extra=FLOAT)
    whole = images(make_loader(cfg, epochs=1))
    first = make_loader(cfg, epochs=1)
    head = images(first, limit=2)
    state = first.state_dict()
    first.close()
    resumed = make_loader(cfg, epochs=1)
    resumed.load_state_dict(state)
    rest = images(resumed)
    assert len(head) + len(rest) == len(whole)
    for (pw, iw), (pg, ig) in zip(whole, head + rest):
        assert pw == pg and np.array_equal(iw, ig)


def test_augmentation_time_shows_in_stats(make_loader, daemon, dataset):
    loader = make_loader(config(dataset.root, RECIPE, batch=8, extra=FLOAT), epochs=1)
    it = iter(loader)
    next(it)
    out = subprocess.run([str(SPDLCTL), "--socket", daemon.socket, "--json", "stats"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    names = json.dumps(json.loads(out))
    for row in ("aug:rand_augment", "aug:color_jitter", "aug:random_erasing"):
        assert row in names, out
    for _ in it:
        pass
    stages = {s["name"]: s for s in loader.stats()["stages"]}
    for row in ("aug:rand_augment", "aug:color_jitter", "aug:random_erasing"):
        assert row in stages, sorted(stages)
    print("stats rows:", {k: v for k, v in stages.items() if k.startswith("aug:")})


def test_random_crop_with_padding_through_the_daemon(make_loader, dataset):
    # size = the padded size: the window is the whole padded image (no draw), so the pixels are pinned.
    got = {}
    cfg = config(dataset.root, "  - random_crop: {size: [62, 60], padding: [2, 3], pad_mode: reflect}\n")
    for batch in make_loader(cfg, epochs=1):
        batch_images = np.from_dlpack(batch["image"])
        assert batch_images.shape[1:] == (62, 60, 3)
        for path, image in zip(batch.paths, batch_images):
            got[path] = image.copy()
    for p in dataset.files:
        want = np.asarray(F.pad(base(dataset.root, p), [2, 3], padding_mode="reflect"))
        assert np.array_equal(got[p], want), p
    # A smaller window: 48 x 48 out of the padded 64 x 64, at a drawn position, deterministic.
    cfg = config(dataset.root, "  - random_crop: {size: 48, padding: 4}\n")
    a, b = images(make_loader(cfg, epochs=1)), images(make_loader(cfg, epochs=1))
    assert all(np.array_equal(x, y) for (_, x), (_, y) in zip(a, b))
    assert a[0][1].shape[1:] == (48, 48, 3)


def test_resize_max_size_through_the_daemon(make_loader, dataset):
    cfg = (f"source: {{type: image_folder, root: {dataset.root}}}\nsampler: {{shuffle: false}}\nbatch: {{size: 16}}\n"
           "transforms:\n  - resize: {shorter: 64, max_size: 80, antialias: true}\n  - center_crop: {size: 56}\n")
    got = {}
    for batch in make_loader(cfg, epochs=1):
        for path, image in zip(batch.paths, np.from_dlpack(batch["image"])):
            got[path] = image.copy()
    capped = 0
    for p in dataset.files:
        img = Image.open(dataset.root / p).convert("RGB")
        resized = F.resize(img, 64, max_size=80)
        capped += min(resized.size) < 64
        want = np.asarray(F.center_crop(resized, 56))
        assert np.array_equal(got[p], want), p
    assert capped > 0  # some images were limited by max_size (and padded by the crop)


def test_shared_augmented_job_gives_every_member_the_same_pixels_as_a_job_of_its_own(make_loader, dataset):
    share = "share: true\nshare_members: 2\nshare_wait_seconds: 20\n"
    cfg = config(dataset.root, RECIPE, batch=8, extra=FLOAT + share)
    a, b = make_loader(cfg, epochs=1), make_loader(cfg, epochs=1)
    pairs = [((list(x.paths), np.from_dlpack(x["image"]).copy()), (list(y.paths), np.from_dlpack(y["image"]).copy()))
             for x, y in zip(a, b)]
    alone = images(make_loader(config(dataset.root, RECIPE, batch=8, extra=FLOAT), epochs=1))
    assert len(pairs) == len(alone)
    for ((pa, ia), (pb, ib)), (pc, ic) in zip(pairs, alone):
        assert pa == pb == pc
        assert np.array_equal(ia, ib) and np.array_equal(ia, ic)


@pytest.mark.parametrize("output", ["{dtype: uint8, layout: NHWC}", "{dtype: float16, layout: NCHW}"])
def test_random_erasing_writes_its_value_in_any_dtype_and_layout(make_loader, dataset, output):
    cfg = config(dataset.root, "  - random_erasing: {p: 1, value: [1, 0, 0]}\n", extra=f"output: {output}\n")
    erased = 0
    for batch in make_loader(cfg, epochs=1):
        imgs = np.from_dlpack(batch["image"]).astype(np.float32)
        if imgs.shape[-1] != 3:
            imgs = imgs.transpose(0, 2, 3, 1)
        for img in imgs:
            mask = (img[..., 0] == 1) & (img[..., 1] == 0) & (img[..., 2] == 0)
            erased += int(mask.any())
            ys, xs = np.nonzero(mask)
            if len(ys):  # one rectangle
                box = mask[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
                assert box.mean() > 0.9
    assert erased >= len(dataset.files) - 1


def test_augmentations_on_gray_images(make_loader, dataset):
    cfg = config(dataset.root, "  - rand_augment: {}\n  - color_jitter: {brightness: 0.5, saturation: 0.5}\n",
                 extra="decode: {color: gray}\n")
    a, b = images(make_loader(cfg, epochs=1)), images(make_loader(cfg, epochs=1))
    assert a[0][1].shape[1:] == (56, 56, 1)
    assert all(np.array_equal(x, y) for (_, x), (_, y) in zip(a, b))
