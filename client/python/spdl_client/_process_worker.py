"""The worker side of ``transform_executor="process"``: one process of the loader's transform pool.

A worker is started once (forkserver or spawn, never fork) with one end of a socket pair to the
trainer, and then serves it until told to stop or until the trainer's end closes (the trainer exited
or died: no orphan outlives it). Messages (pickled, in order; descriptors travel as SCM_RIGHTS
right after the message that announces them):

trainer -> worker
  ("init", kind, fn_bytes)        kind "batch" or "sample"; fn_bytes: the pickled FN (by reference)
  ("region", region_id, size) +fd the job's shared region: mapped once, kept until the next one
  ("task", task_id, desc)         one batch: where its tensors lie in the region (offset, shape,
                                  dtype) and its metadata; the trainer keeps the slot leased until
                                  the reply
  None                            exit
worker -> trainer
  ("ready", pid) / ("init_error", error)
  ("ok", task_id, data, layout) [+fd]   FN's result pickled (protocol 5); its large buffers (numpy
                                  arrays, CPU torch tensors) out of band in one memfd sent after
                                  the message, at the offsets of `layout` (empty: no descriptor)
  ("err", task_id, error)         FN raised; `error` from :func:`pack_error`

Thread safety: none needed; a worker is single-threaded (FN may start threads of its own).
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import sys
import traceback
from collections.abc import Mapping
from multiprocessing import reduction
from typing import Any, Optional

# Buffers of at least this many bytes leave the worker through shared memory (one memfd per
# result); smaller ones are pickled in line with the rest of the result.
OUT_OF_BAND_MIN_BYTES = 64 * 1024
_ALIGN = 64


class WorkerBatch(Mapping):
    """What FN gets in a transform worker in place of a :class:`spdl_client.Batch`: a read-only
    mapping of tensor name to a numpy array that is a zero-copy view of the batch's slot (the slot
    stays leased by the trainer until FN returns), with the Batch's metadata attributes (``epoch``,
    ``batch_in_epoch``, ``seq``, ``rows``, ``slot``, ``paths``, ``labels``, ``seed``) and its
    ``torch()``, ``numpy()`` and ``release()`` (a no-op here). numpy arrays take the DLPack
    protocol, so ``torch.from_dlpack(batch["image"])`` / ``numpy.from_dlpack`` /
    ``jax.dlpack.from_dlpack`` work as they do on the trainer's Batch.

    The views are valid only during the call: once FN returns the trainer gives the slot back and
    the daemon refills it. Return copies (or arrays computed from the views), never the views
    themselves kept elsewhere in the worker; what FN returns is copied out anyway."""

    __slots__ = ("_arrays", "epoch", "batch_in_epoch", "seq", "rows", "slot", "paths", "labels", "seed",
                 "resume_token")

    def __init__(self, arrays: dict, meta: dict) -> None:
        self._arrays = arrays
        self.epoch: int = meta["epoch"]
        self.batch_in_epoch: int = meta["batch_in_epoch"]
        self.seq: int = meta["seq"]
        self.rows: int = meta["rows"]
        self.slot: int = meta["slot"]
        self.paths: list = meta["paths"]
        self.labels: list = meta["labels"]
        self.seed: Optional[int] = meta["seed"]
        self.resume_token: bytes = meta["resume_token"]

    def __getitem__(self, name: str):
        return self._arrays[name]

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def release(self) -> None:
        """A no-op: the trainer releases the slot when FN has returned."""

    @property
    def released(self) -> bool:
        return False

    def torch(self) -> dict:
        import torch

        return {name: torch.from_numpy(a) for name, a in self._arrays.items()}

    def numpy(self) -> dict:
        return dict(self._arrays)

    def __repr__(self) -> str:
        tensors = ", ".join(f"{n}: {a.dtype}{list(a.shape)}" for n, a in self._arrays.items())
        return (f"<spdl_client WorkerBatch epoch={self.epoch} batch_in_epoch={self.batch_in_epoch} rows={self.rows} "
                f"{{{tensors}}} pid={os.getpid()}>")


def pack_error(e: BaseException) -> tuple:
    """An exception as (pickled exception or None, its type's name, str(e), traceback text): the
    trainer re-raises the exception itself when it pickles, else a RuntimeError with its text."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    try:
        data = pickle.dumps(e)
        pickle.loads(data)  # some exceptions pickle but do not unpickle (required arguments)
    except Exception:  # noqa: BLE001
        data = None
    return data, type(e).__qualname__, str(e), tb


class _ResultPickler(pickle.Pickler):
    """Pickles CPU torch tensors as numpy arrays (rebuilt with torch.from_numpy), so that their
    data leaves out of band like a numpy array's instead of through torch's own sharing."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor and obj.device.type == "cpu" and not obj.requires_grad:
            try:
                array = obj.detach().contiguous().numpy()
            except (TypeError, RuntimeError):  # no numpy dtype (bfloat16), or a conjugate view
                return NotImplemented
            return torch.from_numpy, (array,)
        return NotImplemented


def pack_result(result: Any) -> tuple:
    """FN's result as (pickled bytes, [(offset, nbytes)], memfd or -1): buffers of at least
    OUT_OF_BAND_MIN_BYTES are copied once into a new memfd at the given offsets."""
    buffers = []

    def callback(pb: pickle.PickleBuffer) -> bool:
        if pb.raw().nbytes < OUT_OF_BAND_MIN_BYTES:
            return True  # in band
        buffers.append(pb)
        return False

    f = io.BytesIO()
    _ResultPickler(f, protocol=5, buffer_callback=callback).dump(result)
    if not buffers:
        return f.getvalue(), [], -1
    layout, total = [], 0
    for pb in buffers:
        n = pb.raw().nbytes
        layout.append((total, n))
        total += (n + _ALIGN - 1) // _ALIGN * _ALIGN
    fd = os.memfd_create("spdl-transform-result", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, total)
        with mmap.mmap(fd, total) as m:
            for (off, n), pb in zip(layout, buffers):
                m[off:off + n] = pb.raw()
    except BaseException:
        os.close(fd)
        raise
    return f.getvalue(), layout, fd


def unpack_result(data: bytes, layout: list, fd: int) -> Any:
    """The trainer's side of :func:`pack_result`: maps the memfd (and closes the descriptor) and
    unpickles with its buffers, so the result's arrays are views of that mapping (no second copy;
    it is unmapped when they die)."""
    if fd < 0:
        return pickle.loads(data)
    try:
        total = os.fstat(fd).st_size
        m = mmap.mmap(fd, total)
    finally:
        os.close(fd)
    view = memoryview(m)
    return pickle.loads(data, buffers=[view[off:off + n] for off, n in layout])


class _Region:
    __slots__ = ("id", "map")

    def __init__(self, region_id: int, fd: int, size: int) -> None:
        self.id = region_id
        try:
            self.map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except PermissionError:  # a descriptor that does not allow writing
            self.map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)


def _batch(region: _Region, desc: dict) -> WorkerBatch:
    import numpy

    arrays = {}
    for name, offset, shape, dtype in desc["tensors"]:
        arrays[name] = numpy.ndarray(shape, dtype=numpy.dtype(dtype), buffer=region.map, offset=offset)
    return WorkerBatch(arrays, desc)


def main(conn) -> None:
    """The worker's loop (the Process target): serves `conn` until None or EOF."""
    # The trainer handles Ctrl-C; a worker must not die of the terminal's SIGINT mid-batch.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ._transforms import collate_samples

    fn = None
    kind = "batch"
    region: Optional[_Region] = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return  # the trainer is gone
        if msg is None:
            return
        op = msg[0]
        if op == "init":
            _, kind, fn_bytes = msg
            try:
                fn = pickle.loads(fn_bytes)
            except BaseException as e:  # noqa: BLE001: reported to the trainer
                conn.send(("init_error", pack_error(e)))
                return
            conn.send(("ready", os.getpid()))
        elif op == "region":
            _, region_id, size = msg
            fd = reduction.recv_handle(conn)
            try:
                region = None  # the previous job's mapping goes (views FN kept keep it alive)
                region = _Region(region_id, fd, size)
            finally:
                os.close(fd)
        elif op == "task":
            _, task_id, desc = msg
            try:
                batch = _batch(region, desc)
                result = fn(batch) if kind == "batch" else collate_samples(batch, fn)
                del batch
                data, layout, out_fd = pack_result(result)
                del result
            except BaseException as e:  # noqa: BLE001: FN's error goes to the trainer
                conn.send(("err", task_id, pack_error(e)))
                traceback.clear_frames(e.__traceback__)
                del e
                continue
            try:
                conn.send(("ok", task_id, data, layout))
                if out_fd >= 0:
                    reduction.send_handle(conn, out_fd, 0)
            except (BrokenPipeError, ConnectionResetError, EOFError):
                return
            finally:
                if out_fd >= 0:
                    os.close(out_fd)
