"""GPU jobs (output.device: cuda:N) from Python.

Without a GPU: a second spdld started with the test-only flag --test-only-fake-gpu DIR, and this
process on the same fake device (SPDL_TEST_FAKE_GPU_DIR): the whole protocol runs through the real
daemon, and the DLPack capsules a cuda job exports (kDLCUDA) are read back through ctypes — the
fake's "device memory" is a shared file mapping — and compared byte for byte with the CPU path.

With a GPU (torch.cuda.is_available()): torch.from_dlpack gives CUDA tensors equal to the CPU path;
skipped, and said so, elsewhere.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time

import pytest

import spdl_client
from conftest import SPDLD, _connectable, job_yaml

KDLCPU, KDLCUDA = 1, 2


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def capsule_bytes(capsule) -> tuple[DLDevice, tuple, bytes]:
    """(device, shape, the tensor's bytes) of an unconsumed "dltensor" capsule (fake device: host-readable)."""
    m = DLManagedTensor.from_address(_get_pointer(capsule, b"dltensor"))
    t = m.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    n = t.dtype.bits // 8
    for d in shape:
        n *= d
    return DLDevice(t.device.device_type, t.device.device_id), shape, ctypes.string_at(t.data + t.byte_offset, n)


@pytest.fixture(scope="module")
def fake_gpu_daemon(tmp_root, dataset):
    fake = tmp_root / "fake-gpu"
    fake.mkdir(exist_ok=True)
    sock = str(tmp_root / "gpu.sock")
    log = open(tmp_root / "spdld-gpu.log", "wb")
    proc = subprocess.Popen(
        [str(SPDLD), "--socket", sock, "--allow-root", str(tmp_root), "--threads", "2", "--log-level", "warn",
         "--test-only-fake-gpu", str(fake)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while not _connectable(sock):
        assert proc.poll() is None and time.monotonic() < deadline, (tmp_root / "spdld-gpu.log").read_text()
        time.sleep(0.01)
    yield sock, str(fake)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    log.close()
    # It said loudly that it was faking the GPU.
    assert "TEST ONLY" in (tmp_root / "spdld-gpu.log").read_text()


def every_epoch(loader):
    """The batches of all the loader's epochs (one iter() per epoch)."""
    for _ in range(loader.epochs):
        yield from loader


def cpu_reference(sock, root) -> dict:
    out = {}
    with spdl_client.Loader(job_yaml(root, batch=8), socket=sock, epochs=2, rank=0, world_size=1) as loader:
        assert loader.device == "cpu"
        for b in every_epoch(loader):
            out[(b.epoch, b.batch_in_epoch)] = {n: a.tobytes() for n, a in b.numpy().items()}
    return out


@pytest.mark.parametrize("copy", ["daemon", "client"])
def test_cuda_job_exports_kdlcuda_tensors_equal_to_the_cpu_path(fake_gpu_daemon, dataset, copy, monkeypatch):
    sock, fake = fake_gpu_daemon
    monkeypatch.setenv("SPDL_TEST_FAKE_GPU_DIR", fake)  # this process on the daemon's fake device
    ref = cpu_reference(sock, dataset.root)
    got = {}
    extra = f"output: {{device: cuda:0, copy: {copy}}}\n"
    with spdl_client.Loader(job_yaml(dataset.root, batch=8, extra=extra), socket=sock, epochs=2,
                            rank=0, world_size=1) as loader:
        assert loader.device == "cuda:0"
        for b in every_epoch(loader):
            got[(b.epoch, b.batch_in_epoch)] = {}
            for name in b:
                t = b[name]
                assert t.__dlpack_device__() == (KDLCUDA, 0)
                with pytest.raises(BufferError):
                    t.__dlpack__(stream=0)  # ambiguous for CUDA (array API)
                with pytest.raises(BufferError, match="per-thread default stream"):
                    t.__dlpack__(stream=2)  # would be recorded on the deleter's thread's stream
                with pytest.raises(BufferError):
                    t.__dlpack__(dl_device=(KDLCPU, 0))
                cap = t.__dlpack__(stream=1)  # torch's legacy default stream
                dev, shape, data = capsule_bytes(cap)
                assert (dev.device_type, dev.device_id) == (KDLCUDA, 0)
                assert shape == tuple(t.shape)
                got[(b.epoch, b.batch_in_epoch)][name] = data
                del cap  # unconsumed: its destructor frees the export
            b.release()
    assert got == ref
    assert loader.held_batches == 0


@pytest.mark.parametrize("copy", ["daemon", "client"])
def test_cuda_n_is_the_trainers_ordinal_found_by_uuid(fake_gpu_daemon, dataset, copy, monkeypatch):
    """The trainer numbers the GPUs otherwise than spdld (CUDA_VISIBLE_DEVICES=1,0 in the trainer,
    modelled by the fake's SPDL_TEST_FAKE_GPU_VISIBLE): cuda:0 is the trainer's cuda:0 in both copy
    modes, because the loader sends that GPU's UUID and spdld finds its own ordinal for it."""
    sock, fake = fake_gpu_daemon
    monkeypatch.setenv("SPDL_TEST_FAKE_GPU_DIR", fake)
    plain = {i: spdl_client._spdl_client.cuda_device_uuid(i) for i in (0, 1)}
    monkeypatch.setenv("SPDL_TEST_FAKE_GPU_VISIBLE", "1,0")
    swapped = spdl_client._spdl_client.cuda_device_uuid(0)
    assert len(swapped) == 16 and swapped == plain[1] and swapped != plain[0]
    ref = cpu_reference(sock, dataset.root)
    got = {}
    extra = f"output: {{device: cuda:0, copy: {copy}}}\n"
    with spdl_client.Loader(job_yaml(dataset.root, batch=8, extra=extra), socket=sock, epochs=2,
                            rank=0, world_size=1) as loader:
        assert loader.device == "cuda:0"
        for b in every_epoch(loader):
            got[(b.epoch, b.batch_in_epoch)] = {}
            for name in b:
                dev, _, data = capsule_bytes(b[name].__dlpack__(stream=1))
                assert (dev.device_type, dev.device_id) == (KDLCUDA, 0)
                got[(b.epoch, b.batch_in_epoch)][name] = data
            b.release()
    assert got == ref


def test_a_gpu_spdld_does_not_see_is_refused_naming_its_uuid(fake_gpu_daemon, dataset, monkeypatch):
    sock, fake = fake_gpu_daemon
    monkeypatch.setenv("SPDL_TEST_FAKE_GPU_DIR", fake)
    monkeypatch.setenv("SPDL_TEST_FAKE_GPU_VISIBLE", "7")  # a GPU outside spdld's CUDA_VISIBLE_DEVICES
    uuid = spdl_client._spdl_client.cuda_device_uuid(0)
    text = "GPU-" + "-".join(uuid[a:b].hex() for a, b in ((0, 4), (4, 6), (6, 8), (8, 10), (10, 16)))
    extra = "output: {device: cuda:0, copy: daemon}\n"
    with pytest.raises(spdl_client.SpdlError) as e:
        spdl_client.Loader(job_yaml(dataset.root, batch=8, extra=extra), socket=sock, rank=0, world_size=1)
    assert text in str(e.value)
    assert "CUDA_VISIBLE_DEVICES" in str(e.value)


def test_gpu_tensors_outlive_the_loader(fake_gpu_daemon, dataset, monkeypatch):
    """Views kept after loader.close() still read their batch: the IPC mapping and the daemon's device
    memory live as long as the last view (before, close() unmapped it under them)."""
    sock, fake = fake_gpu_daemon
    monkeypatch.setenv("SPDL_TEST_FAKE_GPU_DIR", fake)
    ref = cpu_reference(sock, dataset.root)
    mine = f"mem-{os.getpid()}-"

    def daemon_memory():
        return [p for p in os.listdir(fake) if p.startswith("mem-") and not p.startswith(mine)]

    assert not daemon_memory()
    loader = spdl_client.Loader(job_yaml(dataset.root, batch=8, extra="output: {device: cuda:0}\n"), socket=sock,
                                epochs=2, rank=0, world_size=1)
    b = next(iter(loader))
    key = (b.epoch, b.batch_in_epoch)
    caps = {name: b[name].__dlpack__(stream=1) for name in b}
    del b
    loader.close()
    assert daemon_memory()  # kept for the views
    assert {name: capsule_bytes(c)[2] for name, c in caps.items()} == ref[key]
    del caps  # the last views: the client unmaps, tells the daemon, which frees
    deadline = time.monotonic() + 10
    while daemon_memory() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not daemon_memory()


def test_torch_takes_cuda_tensors_equal_to_the_cpu_path(make_loader, daemon, dataset):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("skipped: no CUDA device (torch.cuda.is_available() is False); runs on a GPU machine")
    ref = cpu_reference(daemon.socket, dataset.root)
    for copy in ("daemon", "client"):
        loader = make_loader(batch=8, epochs=2, extra=f"output: {{device: cuda:0, copy: {copy}}}\n")
        for b in every_epoch(loader):
            for name in b:
                x = torch.from_dlpack(b[name])
                assert x.is_cuda
                assert x.cpu().contiguous().numpy().tobytes() == ref[(b.epoch, b.batch_in_epoch)][name]
            b.release()
