"""The benchmark's dataset: ImageNet-like JPEGs written by spdl-make-dataset, reproducibly.

make() reuses a dataset already written with the same parameters (a manifest records them and
what was written); describe() measures what is on disk; warm() reads every file once.
"""
import json
import os
import shutil
import subprocess

MANIFEST = "spdld-bench-manifest.json"


def files(root):
    out = []
    for c in sorted(os.listdir(root)):
        d = os.path.join(root, c)
        if os.path.isdir(d):
            out += [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.lower().endswith((".jpg", ".jpeg"))]
    return out


def describe(root):
    """count, mean width/height/pixels/bytes and the chroma subsampling, read from the files."""
    from PIL import Image, JpegImagePlugin

    paths = files(root)
    w = h = px = nbytes = 0
    sampling = {}
    for p in paths:
        with Image.open(p) as im:
            w += im.size[0]
            h += im.size[1]
            px += im.size[0] * im.size[1]
            s = {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}.get(JpegImagePlugin.get_sampling(im), "other")
            sampling[s] = sampling.get(s, 0) + 1
        nbytes += os.path.getsize(p)
    n = max(len(paths), 1)
    return {"count": len(paths), "classes": len([d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))]),
            "mean_width": w / n, "mean_height": h / n, "mean_pixels": px / n,
            "mean_bytes": nbytes / n, "total_bytes": nbytes, "subsampling": sampling}


def make(tool, root, classes, per_class, seed, min_side, max_side, quality, log=print):
    params = {"classes": classes, "per_class": per_class, "seed": seed, "min_side": min_side,
              "max_side": max_side, "quality": quality}
    manifest = os.path.join(root, MANIFEST)
    if os.path.exists(manifest):
        with open(manifest) as f:
            m = json.load(f)
        if m.get("params") == params and len(files(root)) == classes * per_class:
            log(f"dataset: reusing {root}")
            return m["description"]
    if os.path.exists(root):
        shutil.rmtree(root)
    log(f"dataset: writing {classes * per_class} JPEGs to {root}")
    subprocess.run([tool, root, "--classes", str(classes), "--per-class", str(per_class), "--seed", str(seed),
                    "--min-side", str(min_side), "--max-side", str(max_side), "--quality", str(quality)],
                   check=True, stdout=subprocess.DEVNULL)
    d = describe(root)
    with open(manifest, "w") as f:
        json.dump({"params": params, "description": d}, f, indent=1)
    return d


def _large_one(job):
    """One large photo: tests/python/photos.py's photo made at a quarter of the size (its noise
    fields cost minutes at 12 MP), scaled up (bicubic), then hard edges and sensor noise at full
    resolution so the file has a real photo's detail and entropy (~1 MB per 3 MP at quality 90)."""
    path, seed, min_side, max_side, quality = job
    import numpy as np
    from PIL import Image, ImageDraw
    from photos import make_photo, save_photo

    rng = np.random.default_rng(seed)
    w, h = (int(x) for x in rng.integers(min_side, max_side + 1, 2))
    img = make_photo(rng, max(w // 4, 16), max(h // 4, 16)).resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(40):  # thin lines and small objects at full resolution
        x0, y0 = float(rng.uniform(0, w)), float(rng.uniform(0, h))
        x1, y1 = x0 + float(rng.uniform(-0.2, 0.2)) * w, y0 + float(rng.uniform(-0.2, 0.2)) * h
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        draw.line([x0, y0, x1, y1], fill=colour, width=int(rng.integers(1, 6)))
    a = np.asarray(img, dtype=np.int16)
    a = a + rng.integers(-6, 7, a.shape, dtype=np.int16)  # sensor noise
    save_photo(Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)), path, "420", quality)
    return path


def make_large(root, classes, per_class, seed, min_side, max_side, quality, log=print, workers=2):
    """Large photograph-like JPEGs (tests/python/photos.py: a 1/f colour field, hard-edged objects,
    texture, sensor noise), sides uniform in [min_side, max_side], 4:2:0 at `quality`, like phone
    photos or OpenImages; reproducible from the seed (one generator per file, seeded by seed and
    the file's number). Reused while the parameters match, as make()."""
    params = {"kind": "large-photos", "classes": classes, "per_class": per_class, "seed": seed,
              "min_side": min_side, "max_side": max_side, "quality": quality}
    manifest = os.path.join(root, MANIFEST)
    if os.path.exists(manifest):
        with open(manifest) as f:
            m = json.load(f)
        if m.get("params") == params and len(files(root)) == classes * per_class:
            log(f"dataset: reusing {root}")
            return m["description"]
    if os.path.exists(root):
        shutil.rmtree(root)
    import multiprocessing
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "tests", "python"))
    jobs = []
    for c in range(classes):
        d = os.path.join(root, f"class_{c:03d}")
        os.makedirs(d, exist_ok=True)
        for i in range(per_class):
            jobs.append((os.path.join(d, f"photo_{i:04d}.jpg"), seed * 100003 + c * 1009 + i, min_side, max_side,
                         quality))
    log(f"dataset: writing {len(jobs)} large photo JPEGs to {root} ({workers} processes; minutes, once)")
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        for _ in pool.imap_unordered(_large_one, jobs):
            pass
    d = describe(root)
    with open(manifest, "w") as f:
        json.dump({"params": params, "description": d}, f, indent=1)
    return d


def make_shards(python, tool, root, out, max_side, log=print):
    """`spdl-shard --folder root out --max-side N` once (reused while its manifest's options and
    the source count match); returns the brace pattern of the shards and the sample count."""
    name = "shard"
    manifest = os.path.join(out, f"{name}.manifest.json")
    want = len(files(root))
    if os.path.exists(manifest):
        with open(manifest) as f:
            m = json.load(f)
        if sum(s.get("samples", 0) for s in m.get("shards", [])) == want and \
                (m.get("options") or {}).get("max_side") == max_side:
            log(f"shards: reusing {out}")
            return _pattern(out, name, len(m["shards"])), want
    if os.path.exists(out):
        shutil.rmtree(out)
    log(f"shards: writing {want} samples re-encoded to --max-side {max_side} into {out}")
    subprocess.run([python, tool, out, "--folder", root, "--max-side", str(max_side), "--shard-size", "1000",
                    "--name", name, "--workers", "2", "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    with open(manifest) as f:
        m = json.load(f)
    return _pattern(out, name, len(m["shards"])), want


def _pattern(out, name, n):
    return os.path.join(out, f"{name}-{{000000..{n - 1:06d}}}.tar")


def shard_bytes(out):
    return sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out) if f.endswith(".tar"))


def warm_shards(out):
    n = 0
    for f in sorted(os.listdir(out)):
        if f.endswith(".tar"):
            with open(os.path.join(out, f), "rb") as fh:
                while chunk := fh.read(1 << 20):
                    n += len(chunk)
    return n


def warm(root):
    """Reads every file once, so both loaders find the whole dataset in the page cache."""
    n = 0
    for p in files(root):
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                n += len(chunk)
    return n
