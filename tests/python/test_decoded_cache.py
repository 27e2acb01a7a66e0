"""The job's cache of decoded, shrunk samples (job config cache: {decoded: {max_side}}), against a
real spdld on the test folder (48 JPEGs, 64..160 px): epoch 2 decodes no JPEG (the daemon's
counters), both epochs see the same shrunk image, the pixels are PIL's box shrink followed by the
job's transforms, the same run twice gives the same bytes, and a cap smaller than the dataset
caches what fits and counts the rest."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from conftest import CLASSES, PER_CLASS, job_yaml

N = CLASSES * PER_CLASS  # 48 images
MAX_SIDE = 96  # below most of the test images' longer sides: they are really shrunk


def run(loader) -> list:
    """Every batch of every epoch as (epoch, paths, image bytes per row)."""
    out = []
    for _ in range(loader.epochs):
        for b in loader:
            images = np.from_dlpack(b["image"]).copy()
            out.append((b.epoch, list(b.paths), [images[i].tobytes() for i in range(len(b.paths))]))
    return out


def values(loader) -> dict:
    assert loader.finished
    return loader.stats()["values"]


def test_epoch_2_decodes_no_jpeg_and_sees_the_same_shrunk_image(make_loader, dataset):
    # No shuffle: the last samples of epoch 1 and the first of epoch 2 are different files, so no
    # sample is in flight in both epochs at once and the counts are exact.
    loader = make_loader(batch=8, epochs=2, shuffle=False, extra=f"cache: {{decoded: {{max_side: {MAX_SIDE}}}}}\n")
    batches = run(loader)
    v = values(loader)
    assert v["decoded_cache_shrinks"] == N  # every file decoded once, in epoch 1
    assert v["decoded_cache_hits"] == N  # every read of epoch 2 served from memory: no JPEG decode
    assert v["decoded_cache_samples"] == N and v["decoded_cache_refused"] == 0
    assert 0 < v["decoded_cache_bytes"] <= N * (MAX_SIDE * MAX_SIDE * 3 + 54 + 4 * MAX_SIDE + 128)
    # resize + center_crop draws nothing: epoch 2's image of a file equals epoch 1's, bit for bit,
    # so epoch 1 already transformed the shrunk image.
    by_epoch = [{}, {}]
    for epoch, paths, rows in batches:
        by_epoch[epoch].update(zip(paths, rows))
    assert len(by_epoch[0]) == N and by_epoch[0] == by_epoch[1]


def test_pixels_are_a_pil_box_shrink_then_the_transforms(make_loader, dataset):
    import torchvision.transforms as T

    loader = make_loader(batch=16, epochs=1, shuffle=False, extra=f"cache: {{decoded: {{max_side: {MAX_SIDE}}}}}\n")
    tf = T.Compose([T.Resize(64), T.CenterCrop(56)])
    worst = 0.0
    shrunk = 0
    for b in loader:
        images = np.from_dlpack(b["image"])
        for i, path in enumerate(b.paths):
            img = Image.open(dataset.root / path).convert("RGB")
            w, h = img.size
            if max(w, h) > MAX_SIDE:
                shrunk += 1
                s = MAX_SIDE / max(w, h)
                size = (MAX_SIDE, max(1, round(h * s))) if w >= h else (max(1, round(w * s)), MAX_SIDE)
                img = img.resize(size, Image.BOX)
            want = np.asarray(tf(img)).astype(np.int16)
            diff = np.abs(images[i].astype(np.int16) - want)
            worst = max(worst, float(diff.mean()))
            assert diff.max() <= 1, (path, int(diff.max()))
    assert shrunk > N // 2  # the test really exercises the shrink
    print(f"decoded cache vs PIL box shrink + Resize + CenterCrop: worst mean |diff| {worst:.3f}")


def test_same_run_twice_gives_the_same_bytes_with_random_transforms(make_loader, dataset):
    config = (
        f"source: {{type: image_folder, root: {dataset.root}}}\n"
        "sampler: {shuffle: true, seed: 11}\n"
        "batch: {size: 8, drop_last: false}\n"
        "transforms:\n"
        "  - random_resized_crop: {size: 48}\n"
        "  - horizontal_flip: {p: 0.5}\n"
        "prefetch: 3\n"
        f"cache: {{decoded: {{max_side: {MAX_SIDE}}}}}\n"
    )
    a = run(make_loader(config, epochs=2))
    b = run(make_loader(config, epochs=2))
    assert len(a) == 2 * (N // 8)
    assert a == b
    # The crops are drawn anew each epoch on the same cached image: the epochs differ.
    assert [rows for e, _, rows in a if e == 0] != [rows for e, _, rows in a if e == 1]


def test_a_cap_below_the_dataset_caches_what_fits_and_counts_the_rest(make_loader, dataset):
    # max_side 512: the images (64..160 px) keep their size, about 2 MB uncompressed in all; the
    # smallest cap (1 MiB) holds part of them.
    loader = make_loader(batch=8, epochs=2, shuffle=False,
                         extra="cache: {decoded: {max_side: 512, max_bytes: 1048576}}\n")
    uncapped = make_loader(batch=8, epochs=2, shuffle=False, extra="cache: {decoded: {max_side: 512}}\n")
    capped_batches, full_batches = run(loader), run(uncapped)
    v = values(loader)
    held = v["decoded_cache_samples"]
    assert 0 < held < N and v["decoded_cache_bytes"] <= 1048576
    assert v["decoded_cache_refused"] == 2 * (N - held)  # refused in both epochs: decoded again
    assert v["decoded_cache_hits"] == held
    assert v["decoded_cache_shrinks"] == N + (N - held)
    # Cached or not, a sample's pixels are the same.
    assert capped_batches == full_batches


def test_bad_config_is_refused_with_the_key_named(make_loader):
    import spdl_client

    with pytest.raises(spdl_client.SpdlError, match="exif_orientation"):
        make_loader(extra="decode: {exif_orientation: true}\ncache: {decoded: {max_side: 64}}\n")
