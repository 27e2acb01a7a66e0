"""Targets that follow the image, through the real daemon on real files written here by PIL:
- source.type: coco: boxes, box_labels, box_count per sample, against boxes computed here by hand
  from torchvision's geometry (Resize(shorter) + CenterCrop, a center crop's padding, a certain flip,
  EXIF orientation 6); crowd boxes left out; contiguous ids; max_boxes overflow by policy;
- augmentations: boxes follow vertical_flip (with color_jitter, which moves nothing), rotate 90 and
  affine's scale exactly, random_crop and rand_augment's drawn maps keep boxes in the image;
- masks: a .png sidecar beside each image, delivered pixel-exact for crops and flips (vertical_flip
  too) and equal to PIL's NEAREST resize and to torchvision's NEAREST rotate; COCO polygons
  rasterised (source.masks);
- mix: mixup / cutmix soft labels (each row sums to 1; mixup images are the blend the label says;
  the same draws on a rerun);
- client/python/examples/draw_boxes.py on a COCO job writes its PNG.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import spdl_client
from conftest import CLASSES, REPO, subprocess_env


def _photo(w: int, h: int, seed: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 40 + 150 * x / w + 10 * np.sin(y / 5 + seed)
    g = 60 + 120 * y / h + 20 * np.cos(x / 7 + seed)
    b = 90 + 60 * np.sin((x + y) / 9 + seed)
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255).round().astype(np.uint8)


# (file, width, height, exif orientation or None); image ids are given out of order on purpose.
IMAGES = [("a.jpg", 80, 60, None, 5), ("b.jpg", 60, 90, None, 2), ("c.jpg", 100, 50, 6, 9)]
CATEGORIES = [{"id": 3, "name": "cat"}, {"id": 17, "name": "dog"}, {"id": 44, "name": "bottle"}]
# Per image id: (bbox x, y, w, h, category, iscrowd).
OBJECTS = {
    5: [(10, 10, 20, 30, 17, 0), (60, 5, 20, 20, 3, 0), (0, 0, 80, 60, 44, 1)],
    2: [(5, 40, 50, 10, 44, 0)],
    9: [(10, 5, 30, 20, 3, 0), (70, 30, 25, 15, 17, 0)],
}


@pytest.fixture(scope="module")
def coco(daemon):
    root = daemon.tmp / "coco"
    (root / "images").mkdir(parents=True, exist_ok=True)
    images, anns = [], []
    for i, (name, w, h, orientation, image_id) in enumerate(IMAGES):
        img = Image.fromarray(_photo(w, h, i))
        if orientation:
            exif = Image.Exif()
            exif[0x0112] = orientation
            img.save(root / "images" / name, quality=92, exif=exif)
        else:
            img.save(root / "images" / name, quality=92)
        images.append({"id": image_id, "file_name": name, "width": w, "height": h})
        for (x, y, bw, bh, cat, crowd) in OBJECTS[image_id]:
            poly = [x, y, x + bw, y, x + bw, y + bh, x, y + bh]
            anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": cat, "bbox": [x, y, bw, bh],
                         "area": bw * bh, "iscrowd": crowd,
                         "segmentation": {"counts": [0, w * h], "size": [h, w]} if crowd else [poly]})
    (root / "instances.json").write_text(json.dumps({"images": images, "annotations": anns,
                                                     "categories": CATEGORIES}))
    return root


def _coco_job(root, *, transforms: str, extra_source: str = "", extra: str = "", batch: int = 3) -> str:
    return (f"source: {{type: coco, annotations: {root}/instances.json, root: {root}/images{extra_source}}}\n"
            f"sampler: {{shuffle: false}}\nbatch: {{size: {batch}}}\ntransforms:\n{transforms}{extra}")


def _by_id():
    """The images in the order the source gives them: by image id."""
    return sorted(IMAGES, key=lambda t: t[4])


def _expected_boxes(w, h, objects, chain, out_w, out_h, min_size=1.0):
    """Boxes moved by `chain` (a function of a point), enclosing box, clipped, filtered: by hand."""
    out = []
    for (x, y, bw, bh, cat, crowd) in objects:
        if crowd:
            continue
        pts = [chain(px, py) for px, py in ((x, y), (x + bw, y), (x, y + bh), (x + bw, y + bh))]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        x1, x2 = np.clip([min(xs), max(xs)], 0, out_w)
        y1, y2 = np.clip([min(ys), max(ys)], 0, out_h)
        if x2 - x1 <= 0 or y2 - y1 <= 0 or x2 - x1 < min_size or y2 - y1 < min_size:
            continue
        out.append(((x1, y1, x2, y2), cat))
    return out


def _check_batch(batch, expected_per_row, max_boxes):
    boxes = np.from_dlpack(batch["boxes"])
    labels = np.from_dlpack(batch["box_labels"])
    count = np.from_dlpack(batch["box_count"])
    assert boxes.dtype == np.float32 and boxes.shape[1:] == (max_boxes, 4)
    assert labels.dtype == np.int64 and count.dtype == np.int32
    for r, expected in enumerate(expected_per_row):
        assert count[r] == len(expected), (r, count[r], expected)
        for k, (box, cat) in enumerate(expected):
            np.testing.assert_allclose(boxes[r, k], box, atol=1e-4, err_msg=f"row {r} box {k}")
            assert labels[r, k] == cat
        assert not boxes[r, len(expected):].any() and not labels[r, len(expected):].any()


def test_coco_boxes_follow_resize_center_crop_and_flip(make_loader, coco):
    loader = make_loader(_coco_job(coco, transforms="  - resize: {shorter: 40}\n  - center_crop: {size: 32}\n"
                                   "  - horizontal_flip: {p: 1.0}\n", extra_source=", max_boxes: 4"), epochs=1)
    names = [(t["name"], t["dtype"], t["shape"]) for t in loader.info["layout"]]
    assert names == [("image", "uint8", (3, 32, 32, 3)), ("label", "int64", (3,)),
                     ("boxes", "float32", (3, 4, 4)), ("box_labels", "int64", (3, 4)), ("box_count", "int32", (3,))]
    (batch,) = list(loader)
    assert batch.paths == [t[0] for t in _by_id()]
    assert batch.labels == [-1, -1, -1]
    expected = []
    for name, w, h, orientation, image_id in _by_id():
        # orientation is not applied (decode.exif_orientation is off): the stored image is the image
        s = 40 / min(w, h)  # torchvision Resize(40): shorter side 40, longer int(40 * long / short)
        rw, rh = (40, int(40 * h / w)) if w <= h else (int(40 * w / h), 40)
        ox, oy = round((rw - 32) / 2), round((rh - 32) / 2)  # CenterCrop offsets (round half to even)
        chain = lambda x, y, s=s, ox=ox, oy=oy, rw=rw, rh=rh, w=w, h=h: (32 - (x * rw / w - ox), y * rh / h - oy)
        expected.append(_expected_boxes(w, h, OBJECTS[image_id], chain, 32, 32))
    assert any(len(e) for e in expected)
    _check_batch(batch, expected, 4)


def _resize_crop_chain(w, h, then):
    """Resize(40) + CenterCrop(32) of a w x h image (as the test above), then `then` in the 32 x 32 output."""
    rw, rh = (40, int(40 * h / w)) if w <= h else (int(40 * w / h), 40)
    ox, oy = round((rw - 32) / 2), round((rh - 32) / 2)
    return lambda x, y: then(x * rw / w - ox, y * rh / h - oy)


@pytest.mark.parametrize("aug,then", [
    # vertical_flip: y -> 32 - y; color_jitter moves no box
    ("  - vertical_flip: {p: 1}\n  - color_jitter: {brightness: 0.4, contrast: 0.4, saturation: 0.4, hue: 0.1}\n",
     lambda x, y: (x, 32 - y)),
    # rotate 90 (counter-clockwise) of the 32 x 32 image: (x, y) -> (y, 32 - x)
    ("  - rotate: {degrees: [90, 90]}\n", lambda x, y: (y, 32 - x)),
    # affine scale 1.5 about the centre (16, 16), no translation
    ("  - affine: {degrees: 0, scale: [1.5, 1.5]}\n", lambda x, y: (1.5 * (x - 16) + 16, 1.5 * (y - 16) + 16)),
], ids=["vertical_flip+color_jitter", "rotate90", "affine_scale"])
def test_coco_boxes_follow_the_augmentations(make_loader, coco, aug, then):
    loader = make_loader(_coco_job(coco, transforms="  - resize: {shorter: 40}\n  - center_crop: {size: 32}\n" + aug,
                                   extra_source=", max_boxes: 4"), epochs=1)
    (batch,) = list(loader)
    expected = [_expected_boxes(w, h, OBJECTS[image_id], _resize_crop_chain(w, h, then), 32, 32)
                for name, w, h, orientation, image_id in _by_id()]
    assert any(len(e) for e in expected)
    _check_batch(batch, expected, 4)


def test_coco_boxes_stay_in_the_image_through_rand_augment_and_random_crop(make_loader, coco):
    """The policies' drawn maps and random_crop's reach the boxes: every kept box lies in the 28 x 28
    output and is not empty; the same boxes on a rerun (deterministic from the seed)."""
    cfg = _coco_job(coco, transforms="  - resize: {shorter: 40}\n  - center_crop: {size: 32}\n"
                    "  - random_crop: {size: 28, padding: 4}\n  - rand_augment: {num_ops: 2, magnitude: 9}\n",
                    extra_source=", max_boxes: 4")
    runs = []
    for _ in range(2):
        (batch,) = list(make_loader(cfg, epochs=1))
        boxes, count = np.from_dlpack(batch["boxes"]).copy(), np.from_dlpack(batch["box_count"]).copy()
        for r in range(3):
            b = boxes[r, :count[r]]
            assert (b[:, 0] >= 0).all() and (b[:, 2] <= 28).all() and (b[:, 1] >= 0).all() and (b[:, 3] <= 28).all()
            assert (b[:, 2] - b[:, 0] >= 1).all() and (b[:, 3] - b[:, 1] >= 1).all()
        runs.append((boxes, count))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    assert count.sum() > 0


def test_coco_boxes_follow_exif_rotation_and_padding(make_loader, coco):
    # Center crop larger than the image: the image is padded, the boxes move by the padding.
    # EXIF 6 (c.jpg): stored 100 x 50 turns upright to 50 x 100: (x, y) -> (50 - y, x).
    loader = make_loader(_coco_job(coco, transforms="  - center_crop: {size: [110, 100]}\n",
                                   extra="decode: {exif_orientation: true}\n", extra_source=", contiguous_ids: true"),
                         epochs=1)
    (batch,) = list(loader)
    contiguous = {c["id"]: i for i, c in enumerate(sorted(CATEGORIES, key=lambda c: c["id"]))}
    expected = []
    for name, w, h, orientation, image_id in _by_id():
        dw, dh = (h, w) if orientation == 6 else (w, h)
        pad_x, pad_y = (100 - dw) // 2, (110 - dh) // 2  # torchvision pads (crop - size) // 2 before
        up = (lambda x, y, h=h: (h - y, x)) if orientation == 6 else (lambda x, y: (x, y))
        chain = lambda x, y, up=up, px=pad_x, py=pad_y: (up(x, y)[0] + px, up(x, y)[1] + py)
        expected.append([(b, contiguous[c]) for b, c in _expected_boxes(w, h, OBJECTS[image_id], chain, 100, 110)])
    _check_batch(batch, expected, 100)
    # The padding is black and the upright image of c.jpg sits where the boxes say.
    images = np.from_dlpack(batch["image"])
    assert images.shape == (3, 110, 100, 3)
    assert not images[2, :, :25].any() and images[2, 5:105, 25:75].mean() > 20


def test_coco_overflow_crowd_and_random_crops(make_loader, coco):
    # Image 5 has two boxes; max_boxes 1 with on_overflow: error fails the sample (on_error: fail -> job error).
    cfg = _coco_job(coco, transforms="  - resize: {height: 30, width: 40}\n", extra_source=", max_boxes: 1",
                    extra="on_error: fail\n")
    with pytest.raises(spdl_client.SpdlError, match="more than source.max_boxes 1"):
        list(make_loader(cfg, epochs=1))
    # truncate keeps the first; include_crowd adds the crowd box (whole image).
    cfg = _coco_job(coco, transforms="  - resize: {height: 30, width: 40}\n",
                    extra_source=", max_boxes: 1, on_overflow: truncate")
    (batch,) = list(make_loader(cfg, epochs=1))
    count = np.from_dlpack(batch["box_count"])
    assert count.tolist() == [1, 1, 1]
    cfg = _coco_job(coco, transforms="  - resize: {height: 30, width: 40}\n", extra_source=", include_crowd: true")
    (batch,) = list(make_loader(cfg, epochs=1))
    assert np.from_dlpack(batch["box_count"]).tolist() == [1, 3, 2]
    boxes = np.from_dlpack(batch["boxes"])
    np.testing.assert_allclose(boxes[1, 2], [0, 0, 40, 30])  # the crowd region: the whole image
    # random_resized_crop: every box lies inside the output, and the same seed gives the same boxes.
    cfg = _coco_job(coco, transforms="  - random_resized_crop: {size: 24, scale: [0.3, 1.0]}\n")
    runs = []
    for _ in range(2):
        (batch,) = list(make_loader(cfg, epochs=1))
        b = np.from_dlpack(batch["boxes"]).copy()
        assert (b >= 0).all() and (b <= 24).all()
        runs.append((b, np.from_dlpack(batch["box_count"]).copy()))
        del batch
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])


def test_coco_masks_rasterise_the_polygons(make_loader, coco):
    cfg = _coco_job(coco, transforms="  - center_crop: {size: [40, 50]}\n  - horizontal_flip: {p: 1.0}\n",
                    extra_source=", masks: true, contiguous_ids: true")
    (batch,) = list(make_loader(cfg, epochs=1))
    masks = np.from_dlpack(batch["mask"])
    assert masks.dtype == np.uint8 and masks.shape == (3, 40, 50)
    contiguous = {c["id"]: i for i, c in enumerate(sorted(CATEGORIES, key=lambda c: c["id"]))}
    for r, (name, w, h, orientation, image_id) in enumerate(_by_id()):
        full = np.zeros((h, w), np.uint8)  # rectangles: pixels whose centres are inside
        for (x, y, bw, bh, cat, crowd) in OBJECTS[image_id]:
            if not crowd:
                full[y:y + bh, x:x + bw] = contiguous[cat] + 1
        padded = np.zeros((max(h, 40) + 40, max(w, 50) + 50), np.uint8)  # torchvision's crop with padding
        py, px = max(0, (40 - h) // 2), max(0, (50 - w) // 2)
        padded[py:py + h, px:px + w] = full
        oy = round((h - 40) / 2) if h >= 40 else 0
        ox = round((w - 50) / 2) if w >= 50 else 0
        want = padded[oy:oy + 40, ox:ox + 50][:, ::-1]
        np.testing.assert_array_equal(masks[r], want, err_msg=name)


@pytest.fixture(scope="module")
def mask_folder(daemon):
    """An image folder: JPEGs and beside each a .png mask (8-bit gray, values 0..4) of its size."""
    root = daemon.tmp / "masks"
    (root / "c").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    masks = {}
    for i, (w, h) in enumerate([(64, 48), (50, 70), (81, 53)]):
        Image.fromarray(_photo(w, h, i)).save(root / "c" / f"{i}.jpg", quality=90)
        m = rng.integers(0, 5, size=(h, w), dtype=np.uint8)
        Image.fromarray(m, mode="L").save(root / "c" / f"{i}.png")
        masks[f"c/{i}.jpg"] = m
    return root, masks


def _mask_job(root, transforms: str) -> str:
    return (f"source: {{type: image_folder, root: {root}}}\nsampler: {{shuffle: false}}\nbatch: {{size: 3}}\n"
            f"transforms:\n{transforms}mask: {{from: .png}}\n")


def test_mask_sidecar_is_pixel_exact_for_crops_and_flips(make_loader, mask_folder):
    root, masks = mask_folder
    (batch,) = list(make_loader(_mask_job(root, "  - center_crop: {size: 40}\n  - horizontal_flip: {p: 1.0}\n"), epochs=1))
    got = np.from_dlpack(batch["mask"])
    assert got.shape == (3, 40, 40)
    for r, path in enumerate(batch.paths):
        m = masks[path]
        h, w = m.shape
        oy, ox = round((h - 40) / 2), round((w - 40) / 2)
        np.testing.assert_array_equal(got[r], m[oy:oy + 40, ox:ox + 40][:, ::-1], err_msg=path)


def test_mask_sidecar_follows_vertical_flip_exactly_and_rotate_as_torchvision(make_loader, mask_folder):
    """vertical_flip: pixel-exact. rotate 30 and affine (rotation, scale, shear): torchvision's
    F.rotate / F.affine on the PIL mask with NEAREST and fill 0 (PIL's affine nearest), compared pixel
    for pixel; the count of differing pixels is printed and must be 0."""
    import torchvision.transforms.functional as F

    root, masks = mask_folder
    (batch,) = list(make_loader(_mask_job(root, "  - center_crop: {size: 40}\n  - vertical_flip: {p: 1}\n"
                                                "  - color_jitter: {brightness: 0.5}\n"), epochs=1))
    got = np.from_dlpack(batch["mask"])
    for r, path in enumerate(batch.paths):
        m = masks[path]
        h, w = m.shape
        oy, ox = round((h - 40) / 2), round((w - 40) / 2)
        np.testing.assert_array_equal(got[r], m[oy:oy + 40, ox:ox + 40][::-1, :], err_msg=path)
    nearest = F.InterpolationMode.NEAREST
    cases = [("rotate 30", "  - rotate: {degrees: [30, 30]}\n",
              lambda im: F.rotate(im, 30, interpolation=nearest, fill=0)),
             ("affine 10 deg, scale 1.3, shear 7", "  - affine: {degrees: [10, 10], scale: [1.3, 1.3], shear: [7, 7]}\n",
              lambda im: F.affine(im, 10, [0, 0], 1.3, [7.0, 0.0], interpolation=nearest, fill=0))]
    for what, aug, fn in cases:
        (batch,) = list(make_loader(_mask_job(root, "  - center_crop: {size: 40}\n" + aug), epochs=1))
        got = np.from_dlpack(batch["mask"])
        for r, path in enumerate(batch.paths):
            m = masks[path]
            h, w = m.shape
            oy, ox = round((h - 40) / 2), round((w - 40) / 2)
            want = np.asarray(fn(Image.fromarray(np.ascontiguousarray(m[oy:oy + 40, ox:ox + 40]), mode="L")))
            diff = int((got[r] != want).sum())
            print(f"mask {what} vs torchvision, {path}: {diff} of {want.size} pixels differ")
            assert diff == 0, (what, path)


def test_segmentation_example_runs_with_its_augmentations(make_loader, mask_folder):
    """config/examples/segmentation.yaml (resize, crop, flip, rotate, color_jitter, normalize) on the
    mask folder: float32 NCHW images, uint8 masks holding only the masks' classes (nearest sampling
    invents no value; 0 where the rotation brings in the outside)."""
    root, masks = mask_folder
    cfg = (REPO / "config/examples/segmentation.yaml").read_text()
    cfg = cfg.replace("root: /var/lib/spdld/seg/train", f"root: {root}").replace("batch: {size: 16}", "batch: {size: 3}")
    (batch,) = list(make_loader(cfg, epochs=1))
    image, mask = np.from_dlpack(batch["image"]), np.from_dlpack(batch["mask"])
    assert image.dtype == np.float32 and image.shape == (3, 3, 384, 384)
    assert mask.dtype == np.uint8 and mask.shape == (3, 384, 384)
    assert set(np.unique(mask)) <= {0, 1, 2, 3, 4} and len(np.unique(mask)) == 5


def test_mask_sidecar_resize_equals_pil_nearest(make_loader, mask_folder):
    """torchvision's Resize + CenterCrop + flip on the PIL mask, pixel for pixel: the
    resize step samples as PIL's NEAREST (including its rounding where a centre falls on an edge)."""
    root, masks = mask_folder
    (batch,) = list(make_loader(_mask_job(root, "  - resize: {height: 33, width: 29}\n"), epochs=1))
    got = np.from_dlpack(batch["mask"])
    for r, path in enumerate(batch.paths):
        want = np.asarray(Image.fromarray(masks[path]).resize((29, 33), Image.NEAREST))
        np.testing.assert_array_equal(got[r], want, err_msg=path)
    import torchvision.transforms as T

    tf = T.Compose([T.Resize(37, interpolation=T.InterpolationMode.NEAREST), T.CenterCrop((30, 34)),
                    T.RandomHorizontalFlip(p=1.0)])
    (batch,) = list(make_loader(_mask_job(root, "  - resize: {shorter: 37}\n  - center_crop: {size: [30, 34]}\n"
                                                "  - horizontal_flip: {p: 1.0}\n"), epochs=1))
    got = np.from_dlpack(batch["mask"])
    for r, path in enumerate(batch.paths):
        want = np.asarray(tf(Image.fromarray(masks[path])))
        np.testing.assert_array_equal(got[r], want, err_msg=path)


def _mix_job(root, mix: str, *, dtype: str = "uint8", seed: int = 7) -> str:
    out = "" if dtype == "uint8" else f"output: {{dtype: {dtype}}}\n"
    return (f"source: {{type: image_folder, root: {root}}}\nsampler: {{shuffle: true, seed: {seed}}}\n"
            f"batch: {{size: 8}}\ntransforms:\n  - resize: {{height: 32, width: 32}}\n{out}"
            + (f"mix: {mix}\n" if mix else ""))


def test_mix_labels_are_soft_and_sum_to_one(make_loader, dataset):
    mix = f"{{mixup: {{alpha: 0.4}}, cutmix: {{alpha: 1.0}}, num_classes: {CLASSES}, label_smoothing: 0.1}}"
    loader = make_loader(_mix_job(dataset.root, mix), epochs=2)
    names = {t["name"]: (t["dtype"], t["shape"]) for t in loader.info["layout"]}
    assert names["label"] == ("float32", (8, CLASSES))
    runs = [[], []]
    for run in runs:
        loader = make_loader(_mix_job(dataset.root, mix), epochs=2)
        for batch in (b for _ in range(2) for b in loader):
            labels = np.from_dlpack(batch["label"])[: batch.rows]
            np.testing.assert_allclose(labels.sum(axis=1), 1.0, atol=1e-5)
            assert (labels >= 0).all() and (labels <= 1).all()
            run.append((labels.copy(), np.from_dlpack(batch["image"])[: batch.rows].copy()))
            del batch
    assert len(runs[0]) == 12
    for (la, ia), (lb, ib) in zip(*runs):  # deterministic from (seed, epoch, batch index)
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(ia, ib)
    assert any(np.sort(l, axis=1)[:, -2].max() > 0.05 for l, _ in runs[0]), "no batch was mixed"


def test_mixup_images_are_the_blend_their_labels_say(make_loader, dataset):
    plain = [(np.from_dlpack(b["image"]).astype(np.float64), list(b.labels))
             for b in make_loader(_mix_job(dataset.root, "", dtype="float32"), epochs=1)]
    mixed = make_loader(_mix_job(dataset.root, f"{{mixup: {{alpha: 1.0}}, num_classes: {CLASSES}}}", dtype="float32"),
                        epochs=1)
    checked = 0
    for (orig, labels), batch in zip(plain, mixed):
        soft = np.from_dlpack(batch["label"])
        images = np.from_dlpack(batch["image"])
        n = batch.rows
        assert batch.labels == labels
        for i in range(n):
            j = n - 1 - i
            if labels[i] == labels[j]:
                continue
            lam = soft[i, labels[i]]
            np.testing.assert_allclose(images[i], lam * orig[i] + (1 - lam) * orig[j], atol=1e-5)
            checked += 1
        del batch
    assert checked > 0


def test_cutmix_pastes_a_box_of_the_area_its_labels_say(make_loader, dataset):
    """cutmix, NCHW float32: row i is row i's image outside one box and row n-1-i's inside it, and its
    label weight on its own class is the area kept (timm's correct_lam)."""
    cfg = lambda mix: _mix_job(dataset.root, mix, dtype="float32").replace(
        "output: {dtype: float32}", "output: {dtype: float32, layout: NCHW}")
    plain = [np.from_dlpack(b["image"]).copy() for b in make_loader(cfg(""), epochs=1)]
    mixed = make_loader(cfg(f"{{cutmix: {{alpha: 1.0}}, num_classes: {CLASSES}}}"), epochs=1)
    checked = 0
    for orig, batch in zip(plain, mixed):
        images, soft, labels, n = np.from_dlpack(batch["image"]), np.from_dlpack(batch["label"]), batch.labels, batch.rows
        for i in range(n):
            j = n - 1 - i
            if i == j:
                continue
            inside = np.any(images[i] != orig[i], axis=0)  # [H, W]: where row j's pixels were pasted
            np.testing.assert_array_equal(images[i][:, inside], orig[j][:, inside])
            np.testing.assert_array_equal(images[i][:, ~inside], orig[i][:, ~inside])
            ys, xs = np.nonzero(inside)
            if len(ys):  # the changed pixels lie in one box, no larger than the box the label implies
                box = (ys.max() - ys.min() + 1) * (xs.max() - xs.min() + 1)
                if labels[i] != labels[j]:
                    area = (1 - soft[i, labels[i]]) * 32 * 32
                    assert inside.sum() <= box <= round(area) + 1e-3
                    checked += 1
        del batch
    assert checked > 0


def test_config_errors_of_targets(make_loader, coco, dataset):
    bad = _coco_job(coco, transforms="  - resize: {shorter: 40}\n", extra_source=", max_boxes: 0, min_visibility: 2")
    with pytest.raises(spdl_client.SpdlError) as e:
        make_loader(bad)
    assert "max_boxes" in str(e.value) and "min_visibility" in str(e.value)
    with pytest.raises(spdl_client.SpdlError, match="num_classes"):
        make_loader(_mix_job(dataset.root, "{mixup: {alpha: 0.2}}"))
    # A label outside num_classes fails the sample, naming it (on_error: fail).
    cfg = _mix_job(dataset.root, "{mixup: {alpha: 0.2}, num_classes: 2}") + "on_error: fail\n"
    with pytest.raises(spdl_client.SpdlError, match="outside mix.num_classes 2"):
        list(make_loader(cfg, epochs=1))


def test_draw_boxes_example_writes_a_png(daemon, coco, tmp_path):
    out = tmp_path / "boxes.png"
    cmd = [sys.executable, str(REPO / "client/python/examples/draw_boxes.py"), "--socket", daemon.socket,
           "--config", str(REPO / "config/examples/coco_detection.yaml"),
           "--set", f"source.annotations={coco}/instances.json", "--set", f"source.root={coco}/images",
           "--set", "batch.size=3", "--out", str(out)]
    proc = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    img = Image.open(out)
    assert img.size[0] > 0 and "boxes per image" in proc.stdout


def test_mix_resume_mid_epoch_gives_the_same_mixed_batches(make_loader, dataset):
    """Resume stays exact with mix: the batches after a mid-epoch checkpoint equal the uninterrupted
    run's, images and soft labels; another mix setting refuses the token (it is in the fingerprint)."""
    import json

    mix = f"{{mixup: {{alpha: 0.4}}, cutmix: {{alpha: 1.0}}, num_classes: {CLASSES}}}"

    def take(loader):
        return [(np.from_dlpack(b["label"]).copy(), np.from_dlpack(b["image"]).copy()) for b in loader]

    ref = take(make_loader(_mix_job(dataset.root, mix), epochs=1))
    loader = make_loader(_mix_job(dataset.root, mix), epochs=1)
    for i, batch in enumerate(loader):
        if i == 1:
            state = json.loads(json.dumps(loader.state_dict()))
            del batch
            break
    loader.close()
    resumed = make_loader(_mix_job(dataset.root, mix), epochs=1)
    resumed.load_state_dict(state)
    got = take(resumed)
    assert len(got) == len(ref) - 2
    for (la, ia), (lb, ib) in zip(got, ref[2:]):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(ia, ib)
    other = make_loader(_mix_job(dataset.root, mix.replace("alpha: 0.4", "alpha: 0.5")), epochs=1)
    with pytest.raises(spdl_client.SpdlError, match="other settings"):
        other.load_state_dict(state)
        list(other)


def test_mask_sidecar_in_tar_shards(make_loader, daemon):
    import io
    import tarfile

    root = daemon.tmp / "mask_tar"
    root.mkdir(exist_ok=True)
    rng = np.random.default_rng(9)
    masks = {}
    with tarfile.open(root / "shard-0.tar", "w") as tar:
        for i in range(3):
            w, h = 40 + 4 * i, 30 + 2 * i
            members = {}
            buf = io.BytesIO()
            Image.fromarray(_photo(w, h, i)).save(buf, format="JPEG", quality=90)
            members[f"{i:04d}.jpg"] = buf.getvalue()
            m = rng.integers(0, 7, size=(h, w), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(m, mode="L").save(buf, format="PNG")
            members[f"{i:04d}.png"] = buf.getvalue()
            masks[f"{i:04d}"] = m
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    cfg = (f"source: {{type: tar, shards: {root}/shard-0.tar, extensions: [.jpg], label_extension: ''}}\n"
           "sampler: {shuffle: false}\nbatch: {size: 3}\ntransforms:\n  - center_crop: {size: [24, 36]}\n"
           "  - horizontal_flip: {p: 1.0}\nmask: {from: .png}\n")
    (batch,) = list(make_loader(cfg, epochs=1))
    got = np.from_dlpack(batch["mask"])
    for r, path in enumerate(batch.paths):
        m = masks[path.split("/")[-1].split(".")[0].split(":")[-1][-4:]]
        h, w = m.shape
        oy, ox = round((h - 24) / 2), round((w - 36) / 2)
        np.testing.assert_array_equal(got[r], m[oy:oy + 24, ox:ox + 36][:, ::-1], err_msg=path)
