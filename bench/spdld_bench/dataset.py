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


def warm(root):
    """Reads every file once, so both loaders find the whole dataset in the page cache."""
    n = 0
    for p in files(root):
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                n += len(chunk)
    return n
