"""Audio jobs through spdl_client: tensors `audio`, `length` and `label` arrive as numpy / torch
arrays via DLPack with the dtype and shape JobAccepted declares, holding the generated sines."""

from __future__ import annotations

import math
import subprocess

import numpy as np
import pytest

SECONDS = {"short": 0.25, "long": 0.75}  # 4000 and 12000 samples at 16 kHz
AMPLITUDE = 0.5


@pytest.fixture(scope="module")
def audio_root(daemon):
    """2 classes x 2 WAV files (16 kHz mono sines) below the daemon's allowed root."""
    root = daemon.tmp / "audio"
    for label, freq in enumerate((300, 600)):
        d = root / f"class_{label}"
        d.mkdir(parents=True, exist_ok=True)
        for name, secs in SECONDS.items():
            subprocess.run(
                ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                 f"aevalsrc={AMPLITUDE}*sin(2*PI*{freq}*t):s=16000:d={secs}", "-c:a", "pcm_s16le",
                 str(d / f"{name}.wav")],
                check=True,
            )
    return root


@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_an_audio_batch_arrives_via_dlpack(make_loader, audio_root, dtype):
    length = 8000  # 0.5 s: the short files are padded, the long ones cut
    config = (
        f"media: audio\nsource: {{root: {audio_root}}}\nsampler: {{shuffle: false}}\n"
        f"audio: {{sample_rate: 16000, channels: 1, length: {length}, dtype: {dtype}}}\nbatch: {{size: 4}}\n"
    )
    loader = make_loader(config, epochs=1)
    assert [(t["name"], t["dtype"], t["shape"]) for t in loader.info["layout"]] == [
        ("audio", dtype, (4, 1, length)),
        ("length", "int64", (4,)),
        ("label", "int64", (4,)),
    ]
    batches = list(loader)
    assert len(batches) == 1
    batch = batches[0]
    audio = np.from_dlpack(batch["audio"])
    lengths = np.from_dlpack(batch["length"])
    labels = np.from_dlpack(batch["label"])
    assert audio.dtype == np.dtype(dtype) and audio.shape == (4, 1, length)
    assert lengths.dtype == np.int64 and labels.tolist() == batch.labels == [0, 0, 1, 1]
    scale = 32768.0 if dtype == "int16" else 1.0
    for r, path in enumerate(batch.paths):
        want = min(length, round(SECONDS[path.split("/")[1].removesuffix(".wav")] * 16000))
        assert abs(int(lengths[r]) - want) <= 2, path
        x = audio[r, 0].astype(np.float64) / scale
        assert not x[int(lengths[r]):].any()  # zero padding
        rms = math.sqrt(float(np.mean(x[200 : want - 200] ** 2)))
        assert abs(rms - AMPLITUDE / math.sqrt(2)) < 0.01, (path, rms)
    # torch (where installed) sees the same memory and dtype.
    try:
        import torch
    except ImportError:
        return  # numpy above saw it; torch's DLPack import is tested in test_memory.py
    t = torch.from_dlpack(batch["audio"])
    assert t.dtype == (torch.float32 if dtype == "float32" else torch.int16) and tuple(t.shape) == (4, 1, length)
