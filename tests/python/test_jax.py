"""JAX and TensorFlow take a batch through DLPack against a real spdld: zero-copy views of image and
label on CPU (the array's data pointer is the slot's), values equal to numpy's, and the slot leased
while the framework's array lives and given back when it dies.

JAX comes from PyPI (`jax[cpu]`, installed by scripts/install-deps.sh test); TensorFlow is optional
(`pip install tensorflow-cpu`): each test says SKIPPED with the reason when its framework is missing.
"""

from __future__ import annotations

import gc
import subprocess
import sys

import numpy as np
import pytest

from conftest import CLASSES, PER_CLASS, REPO, subprocess_env

N = CLASSES * PER_CLASS


def _jax():
    jax = pytest.importorskip(
        "jax", reason="JAX is not installed (pip install 'jax[cpu]'; scripts/install-deps.sh test)")
    import jax.dlpack  # noqa: F401
    import jax.numpy  # noqa: F401

    return jax


def jax_pointer(x) -> int:
    return x.unsafe_buffer_pointer()


@pytest.fixture
def jax_x64():
    """JAX with 64-bit types (jax_enable_x64): the int64 label is then taken as it is, not converted."""
    jax = _jax()
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", False)


@pytest.mark.parametrize("api", ["jnp.from_dlpack", "jax.dlpack.from_dlpack"])
def test_jax_zero_copy_views_keep_the_slot_until_they_die(make_loader, dataset, jax_x64, api):
    jax = jax_x64
    jnp = jax.numpy
    convert = jnp.from_dlpack if api == "jnp.from_dlpack" else jax.dlpack.from_dlpack
    loader = make_loader(batch=8, prefetch=3, shuffle=False)
    it = iter(loader)
    batch = next(it)
    image_t, label_t = batch["image"], batch["label"]
    ref_image = np.from_dlpack(image_t).copy()
    ref_label = np.from_dlpack(label_t).copy()

    image = convert(image_t)
    label = convert(label_t)
    assert image.devices() == {jax.devices("cpu")[0]}
    # Zero copy: the JAX buffers are the slot's memory (inside the job's shared mapping).
    assert jax_pointer(image) == image_t.data_ptr
    assert jax_pointer(label) == label_t.data_ptr
    lo, hi = loader.region_address(), loader.region_address() + loader.region_size()
    assert lo <= jax_pointer(image) < hi and lo <= jax_pointer(label) < hi
    assert image_t.data_ptr % 64 == 0 and label_t.data_ptr % 64 == 0  # XLA's CPU alignment for aliasing
    assert image.shape == (8, 56, 56, 3) and image.dtype == jnp.uint8
    assert label.dtype == jnp.int64
    assert np.array_equal(np.asarray(image), ref_image)
    assert np.array_equal(np.asarray(label), ref_label)
    assert np.asarray(label).tolist() == [dataset.label_of[p] for p in batch.paths]
    # Computing on the views reads the slot.
    assert int(jnp.sum(image, dtype=jnp.int64)) == int(ref_image.sum(dtype=np.int64))

    # The batch's own claim ends; the JAX arrays alone hold the slot now.
    batch.release()
    del batch, image_t, label_t
    gc.collect()
    assert loader.held_batches == 1
    del label
    gc.collect()
    assert loader.held_batches == 1  # the image array still holds it
    del image
    gc.collect()
    assert loader.held_batches == 0  # the last JAX array died: the slot went back

    # The rest of the epoch goes on through the released slots.
    rest = 0
    for b in it:
        x = convert(b["image"])
        assert jax_pointer(x) == b["image"].data_ptr
        rest += 1
        del b, x
    assert rest == N // 8 - 1
    assert loader.held_batches == 0


def test_jax_without_x64_views_the_image_and_converts_the_label(make_loader, dataset):
    """JAX's default (jax_enable_x64 off) has no int64: from_dlpack of the int64 label makes an
    int32 copy (equal values; it does not hold the slot), while the uint8 image stays a view."""
    jax = _jax()
    assert not jax.config.jax_enable_x64
    loader = make_loader(batch=8, prefetch=2, shuffle=False)
    for b in loader:
        image = jax.numpy.from_dlpack(b["image"])
        label = jax.numpy.from_dlpack(b["label"])
        assert jax_pointer(image) == b["image"].data_ptr
        assert label.dtype == jax.numpy.int32 and jax_pointer(label) != b["label"].data_ptr
        assert np.array_equal(np.asarray(label), np.from_dlpack(b["label"]))
        assert np.asarray(label).tolist() == [dataset.label_of[p] for p in b.paths]
        b.release()
        del b, image
        gc.collect()
        assert loader.held_batches == 0  # the int32 label is a copy: only the image held the slot
        del label
    assert loader.held_batches == 0


def test_tensorflow_zero_copy_view_keeps_the_slot_until_it_dies(make_loader):
    tf = pytest.importorskip(
        "tensorflow",
        reason="TensorFlow is not installed (optional: pip install tensorflow-cpu; not in install-deps, ~600 MB)",
    )
    loader = make_loader(batch=8, prefetch=3, shuffle=False)
    batch = next(iter(loader))
    ref = np.from_dlpack(batch["image"]).copy()
    # TensorFlow's from_dlpack takes the capsule (the DLPack protocol's older form).
    image = tf.experimental.dlpack.from_dlpack(batch["image"].__dlpack__())
    label = tf.experimental.dlpack.from_dlpack(batch["label"].__dlpack__())
    assert image.device.endswith("CPU:0")
    # Zero copy: exported back to DLPack, the tensor's data pointer is the slot's.
    assert np.from_dlpack(_TfExport(tf, image)).ctypes.data == batch["image"].data_ptr
    assert np.array_equal(image.numpy(), ref)
    assert label.numpy().tolist() == batch.labels
    batch.release()
    del batch
    gc.collect()
    assert loader.held_batches == 1  # the TensorFlow tensors hold it
    del image, label
    gc.collect()
    assert loader.held_batches == 0


class _TfExport:
    """A TensorFlow tensor as a DLPack producer object for numpy.from_dlpack."""

    def __init__(self, tf, t) -> None:
        self._tf, self._t = tf, t

    def __dlpack__(self, stream=None):
        return self._tf.experimental.dlpack.to_dlpack(self._t)

    def __dlpack_device__(self):
        return (1, 0)


def run_example(name: str, daemon, dataset) -> str:
    p = subprocess.run([sys.executable, str(REPO / "client/python/examples" / name), "--socket", daemon.socket,
                        "--data", str(dataset.root)], env=subprocess_env(), capture_output=True, text=True,
                       timeout=50)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_numpy_example_runs(daemon, dataset):
    out = run_example("numpy_example.py", daemon, dataset)
    assert f"samples: {N}" in out
    assert out.count("images, mean RGB") == CLASSES


def test_jax_example_runs(daemon, dataset):
    _jax()
    out = run_example("jax_example.py", daemon, dataset)
    assert f"epoch 0: {N // 16} steps, loss" in out
