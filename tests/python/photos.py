"""Photograph-like test images, reproducible from a seed, written as JPEGs by PIL.

Used by the parity test (test_parity.py) and the per-operation benchmark (bench/ops/run_ops.py
--photos). The content has what real photographs have and smooth test patterns lack: a 1/f ("natural
image") colour field, hard-edged objects and thin lines, patchy texture and sensor noise; at quality 90
a 500x375 photo is ~100-150 kB, like an ImageNet JPEG.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

# JPEG layouts: PIL's `subsampling` (2 = 4:2:0, 1 = 4:2:2, 0 = 4:4:4), or None for a grayscale JPEG.
LAYOUTS = {"420": 2, "422": 1, "444": 0, "gray": None}

def _field(rng: np.random.Generator, w: int, h: int, channels: int) -> np.ndarray:
    """A 1/f ("natural image") random field: octaves of smooth noise, amplitude halving per octave."""
    out = np.zeros((h, w, channels))
    amp = 1.0
    for octave in range(1, 8):
        gw, gh = max(2, w >> (8 - octave)), max(2, h >> (8 - octave))
        for c in range(channels):
            small = Image.fromarray(rng.normal(0, 1, (gh, gw)).astype(np.float32), mode="F")
            out[..., c] += amp * np.asarray(small.resize((w, h), Image.BICUBIC))
        amp *= 0.55
    return out


def make_photo(rng: np.random.Generator, w: int, h: int) -> Image.Image:
    base = 120 + 45 * _field(rng, w, h, 3) + rng.uniform(-40, 40, 3)
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(14):  # hard edges: objects, horizons, thin lines
        x0, y0 = rng.uniform(-0.2, 1.0) * w, rng.uniform(-0.2, 1.0) * h
        x1, y1 = x0 + rng.uniform(0.05, 0.6) * w, y0 + rng.uniform(0.05, 0.6) * h
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        kind = rng.integers(0, 3)
        if kind == 0:
            draw.ellipse([x0, y0, x1, y1], fill=colour)
        elif kind == 1:
            pts = [(float(rng.uniform(0, w)), float(rng.uniform(0, h))) for _ in range(int(rng.integers(3, 7)))]
            draw.polygon(pts, fill=colour)
        else:
            draw.line([x0, y0, x1, y1], fill=colour, width=int(rng.integers(1, 4)))
    a = np.asarray(img).astype(np.float64)
    a += 12 * _field(rng, w, h, 1)[..., :1] * (rng.uniform(0, 1, (h, w, 1)) > 0.5)  # patchy texture
    a += rng.normal(0, 5, a.shape)  # sensor noise
    return Image.fromarray(np.clip(a, 0, 255).round().astype(np.uint8))




def save_photo(img: Image.Image, path, layout: str, quality: int = 90) -> None:
    """Writes img as a JPEG in one of LAYOUTS."""
    sub = LAYOUTS[layout]
    if sub is None:
        img.convert("L").save(path, format="JPEG", quality=quality)
    else:
        img.save(path, format="JPEG", quality=quality, subsampling=sub)
