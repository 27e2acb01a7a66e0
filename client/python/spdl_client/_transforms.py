"""User transforms in the trainer: ``Loader(..., transform=FN, transform_threads=N)`` and
``Loader(..., sample_transform=FN)``.

The functions run in the trainer's process, on the user's privileges and interpreter: with
``transform_threads=N > 0`` on N threads of a pool owned by the loader, ahead of consumption (a
feeder thread takes the epoch's batches from the daemon and hands each to the pool), results
yielded in batch order; with N = 0 inline in ``next()``. The native module waits with the GIL
released and declares itself safe without it, so on a free-threaded Python the N calls run in
parallel; on a GIL build, parallel as far as FN releases the GIL (torch, numpy, I/O, sleeps).

Bounds: at most ``prefetch - 1`` batches are taken ahead of the trainer (fetched, being
transformed, or transformed and waiting), so the trainer's current result can hold one slot and
the daemon never has more batches out than slots. Parallelism is therefore at most
``min(N, prefetch - 1)``: give the job ``prefetch >= N + 1``.

Errors: an exception raised by FN reaches the training loop from ``next()`` as itself, with a note
naming the batch's epoch and index (``add_note``); the loader is then closed (the feeder stopped
and joined, the batches taken ahead dropped, their slots given back, the job ended). Errors of the
loader itself (the daemon, timeouts) come out of ``next()`` as they would without a transform.

With ``transform_executor="process"`` the N workers are processes instead (``_process_executor``):
the same iterator, bounds and order; FN's exceptions as above; a worker's death fails only its batch
(TransformWorkerError) and the epoch goes on.

Thread safety: a TransformIterator is used from one thread, like the EpochIterator it wraps.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import traceback
import weakref
from typing import Any, Callable, Optional

from ._errors import SpdlError, SpdlTimeoutError

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_BATCH_DOMAIN = 0x7370646C2D626174  # "spdl-bat": separate from the daemon's per-sample seeds


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def batch_seed(sampler_seed: int, epoch: int, batch_in_epoch: int) -> int:
    """The seed of one batch: a 64-bit SplitMix64 hash of (sampler.seed, epoch, batch index), the
    same chain as the daemon's per-sample seeds but in its own domain. A pure function: a rerun or a
    resumed job gives every batch the same seed."""
    h = _mix((int(sampler_seed) ^ _BATCH_DOMAIN) & _MASK)
    h = _mix((h + _GOLDEN + int(epoch)) & _MASK)
    return _mix((h + _GOLDEN + int(batch_in_epoch)) & _MASK)


def sample_seed(batch_seed_value: int, row: int) -> int:
    """The seed handed to a sample transform for row `row` of a batch with seed `batch_seed_value`."""
    return _mix((int(batch_seed_value) + _GOLDEN * (int(row) + 1)) & _MASK)


class TransformSpec:
    """What the user asked for: the batch or the sample function, the executor and its workers.

    ``executor`` "thread" (default): ``workers`` threads of this process (0: inline in ``next()``);
    "process" or a multiprocessing context (forkserver or spawn): ``workers`` (>= 1) processes
    (see ``_process_executor``)."""

    def __init__(self, transform: Optional[Callable], sample_transform: Optional[Callable], threads: int,
                 executor: Any = "thread") -> None:
        if transform is not None and sample_transform is not None:
            raise ValueError("pass either transform= or sample_transform=, not both (compose them in one function)")
        fn = transform if transform is not None else sample_transform
        if fn is not None and not callable(fn):
            raise TypeError(f"transform must be callable, not {type(fn).__name__}")
        threads = int(threads)
        if threads < 0:
            raise ValueError(f"transform_workers must be >= 0 (0: inline in next()), not {threads}")
        self.transform = transform
        self.sample_transform = sample_transform
        self.threads = threads  # the number of workers (threads or processes)
        self.process = executor != "thread"
        if self.process:
            from . import _process_executor

            _process_executor.resolve_context(executor)  # refuses a bad executor now
            if threads < 1:
                raise ValueError(f"transform_executor={executor!r} needs transform_workers >= 1, not {threads}")
            if fn is None:
                raise ValueError(f"transform_executor={executor!r} without a transform= or sample_transform=")
            self._fn_bytes = _process_executor.pickle_fn(fn)
        self.executor = executor
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._procs = None  # the ProcessTransformPool

    @property
    def active(self) -> bool:
        return self.transform is not None or self.sample_transform is not None

    def apply(self, batch) -> Any:
        """FN on one batch (on the calling thread)."""
        if self.transform is not None:
            return self.transform(batch)
        return collate_samples(batch, self.sample_transform)

    def start(self, device: str) -> None:
        """Starts the worker processes of a process executor (once; no-op for threads)."""
        if not self.process or self._procs is not None:
            return
        if device != "cpu":
            raise ValueError(
                f"transform_executor={self.executor!r} works on CPU jobs (the workers map the job's host memory); "
                f"this job delivers to {device}: use the thread executor for GPU batches"
            )
        from . import _process_executor

        self._procs = _process_executor.ProcessTransformPool(
            self._fn_bytes, "batch" if self.transform is not None else "sample", self.threads, self.executor)

    def set_region(self, fd: int, size: int, address: int) -> None:
        """The job's shared region (after every (re)open), for the worker processes."""
        if self._procs is not None:
            self._procs.set_region(fd, size, address)

    def submit(self, batch, what: str) -> concurrent.futures.Future:
        """FN on `batch` on a worker (thread or process), as a Future."""
        if self._procs is not None:
            return self._procs.submit(batch, what)
        return self.pool().submit(self.apply, batch)

    @property
    def processes(self):
        """The ProcessTransformPool, or None (threads)."""
        return self._procs

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="spdl-transform")
        return self._pool

    def shutdown(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        procs, self._procs = self._procs, None
        if procs is not None:
            procs.shutdown()


def _sample_views(batch) -> dict:
    """Per tensor, a view of the whole batch that rows can be sliced from: numpy for host memory,
    torch for GPU memory."""
    views = {}
    for name, t in batch.items():
        device_type = t.__dlpack_device__()[0]
        if device_type == 1:  # kDLCPU
            import numpy

            views[name] = numpy.from_dlpack(t)
        else:
            import torch

            views[name] = torch.from_dlpack(t)
    return views


def collate_samples(batch, fn: Callable) -> dict:
    """``fn`` on each row of ``batch`` (a dict of that row's views plus ``path``, ``label`` and
    ``seed``: the row's own seed from the batch's),
    then the results stacked per key into new tensors (torch when fn returns torch tensors, else
    numpy). Every call must return the same keys with the same shapes. The batch is released
    afterwards: the results are copies."""
    views = _sample_views(batch)
    results = []
    for r in range(batch.rows):
        sample = {name: v[r] for name, v in views.items()}
        sample["path"] = batch.paths[r]
        sample["label"] = batch.labels[r]
        sample["seed"] = None if batch.seed is None else sample_seed(batch.seed, r)
        out = fn(sample)
        if not isinstance(out, dict):
            raise TypeError(f"sample_transform must return a dict of arrays, not {type(out).__name__}")
        if results and out.keys() != results[0].keys():
            raise ValueError(
                f"sample_transform returned keys {sorted(out)} for row {r}, but {sorted(results[0])} for row 0"
            )
        results.append(out)
    del views
    collated = {}
    for key in (results[0] if results else {}):
        values = [s[key] for s in results]
        try:
            import torch

            if isinstance(values[0], torch.Tensor):
                collated[key] = torch.stack(values)
                continue
        except ImportError:
            pass
        import numpy

        shapes = {numpy.shape(v) for v in values}
        if len(shapes) != 1:
            raise ValueError(f"sample_transform returned '{key}' in shapes {sorted(shapes)}: one fixed shape per key")
        collated[key] = numpy.stack([numpy.asarray(v) for v in values])
    batch.release()
    return collated


def _add_note(e: BaseException, batch_meta: tuple) -> None:
    epoch, index = batch_meta
    note = f"spdl_client: raised by the transform of batch {index} of epoch {epoch}; the loader was closed"
    if hasattr(e, "add_note"):
        e.add_note(note)
    else:  # Python < 3.11
        e.__notes__ = getattr(e, "__notes__", []) + [note]


def _is_worker_death(e: BaseException) -> bool:
    """Whether `e` says a transform worker process died on one batch (the loader goes on)."""
    return type(e).__name__ == "TransformWorkerError" and getattr(e, "code", None) == "ABORTED"


_END = object()
_WAITING = object()  # the feeder's "no batch yet"
LOADER_DEFAULT: Any = object()  # "the loader's own timeout"


class TransformIterator:
    """One epoch of a loader's batches through the user's transform: yields FN's results in batch
    order (see the module docstring). Has the EpochIterator's ``epoch``, ``start``, ``position``
    (of the next result), ``len()`` and ``next(timeout=...)``."""

    def __init__(self, loader, inner, spec: TransformSpec, depth: int) -> None:
        self._loader = loader
        self._inner = inner  # the EpochIterator: only the feeder (or, inline, next()) calls it
        self._spec = spec
        self._depth = max(1, depth)
        self.epoch: int = inner.epoch
        self.start: int = inner.start
        self._yielded = 0
        self._last_token: Optional[bytes] = None  # the resume token of the last batch yielded
        self._done = False
        self._closed = False
        self._feeder: Optional[threading.Thread] = None
        self._queue: "queue.Queue" = queue.Queue()
        self._room = threading.Semaphore(self._depth)
        self._stop = threading.Event()
        info = loader.info
        self._slots = int(info["num_slots"])
        self._job_id = info["job_id"]

    @property
    def position(self) -> int:
        """batch_in_epoch of the next result."""
        return self.start + self._yielded

    @property
    def last_token(self) -> Optional[bytes]:
        return self._last_token

    def __iter__(self) -> "TransformIterator":
        return self

    def __len__(self) -> int:
        return 0 if self._done else max(0, len(self._loader) - self.position)

    def __next__(self) -> Any:
        out = self._next(LOADER_DEFAULT)
        if out is _END:
            raise StopIteration
        return out

    def next(self, timeout: Any = None) -> Any:
        """The next result, or None at the epoch's end (iterate instead when FN may return None);
        waits at most ``timeout`` seconds (None: the loader's timeout), then raises
        :class:`SpdlTimeoutError` (nothing is lost)."""
        out = self._next(LOADER_DEFAULT if timeout is None else timeout)
        return None if out is _END else out

    def _next(self, timeout: Any) -> Any:
        if self._done:
            return _END
        if self._closed:
            raise SpdlError("spdl_client: this epoch's transform iterator was closed", "FAILED_PRECONDITION")
        if self._spec.threads == 0:
            batch = self._inner.next() if timeout is LOADER_DEFAULT else self._inner.next(timeout)
            if batch is None:
                self._done = True
                return _END
            meta = (batch.epoch, batch.batch_in_epoch)
            token = batch.resume_token
            try:
                out = self._spec.apply(batch)
            except BaseException as e:  # noqa: BLE001: the user's exception goes on as itself
                del batch
                self._fail(e, meta)
                raise
            del batch
            self._yielded += 1
            self._last_token = token
            return out
        if self._feeder is None:
            self._feeder = threading.Thread(target=TransformIterator._feed, args=(weakref.ref(self),),
                                            name="spdl-transform-feeder", daemon=True)
            self._feeder.start()
        try:
            item = self._queue.get() if timeout is LOADER_DEFAULT else self._queue.get(timeout=timeout)
        except queue.Empty:
            raise SpdlTimeoutError(
                f"spdl_client: no transformed batch {self.position} of epoch {self.epoch} within {timeout:g} s "
                "(nothing was lost: call again to keep waiting)"
            ) from None
        if item is _END:
            self._done = True
            self._join_feeder()
            return _END
        if isinstance(item, BaseException):  # the loader's own error (the daemon, a timeout)
            self._done = True
            self._join_feeder()
            raise item
        future, meta, token = item
        try:
            out = future.result()
        except BaseException as e:  # noqa: BLE001
            del future, item
            self._room.release()
            if _is_worker_death(e):
                # A transform process died on this batch: it is lost, the pool has a new worker, and
                # the epoch goes on (the next call yields the next batch).
                self._yielded += 1
                self._last_token = token
                raise
            self._fail(e, meta)
            raise
        self._room.release()
        self._yielded += 1
        self._last_token = token
        return out

    def _fail(self, e: BaseException, meta: tuple) -> None:
        """FN raised `e` on batch `meta`: note it, free what its frames hold, close the loader."""
        _add_note(e, meta)
        traceback.clear_frames(e.__traceback__)  # FN's finished frames held the batch (its slot)
        self._loader._close_after_transform_error()

    # ---- the feeder thread ----

    @staticmethod
    def _feed(wself: "weakref.ref") -> None:
        """The feeder thread: takes the epoch's batches (at most `depth` ahead of the consumer) and
        submits FN on each. It holds the iterator (and so the loader) only during each short step,
        weakly in between, so a loader the trainer dropped without closing is still collected (and
        its job ended)."""
        import time

        deadline = None
        while True:
            self = wself()
            if self is None or self._stop.is_set():
                return
            room = self._room
            self = None
            if not room.acquire(timeout=0.05):
                continue
            batch = _WAITING
            while batch is _WAITING:  # in slices of at most 0.1 s, holding the iterator only meanwhile
                self = wself()
                if self is None or self._stop.is_set():
                    room.release()
                    return
                try:
                    if deadline is None and self._loader.timeout is not None:
                        deadline = time.monotonic() + self._loader.timeout
                    batch = self._take_once(deadline)
                except BaseException as e:  # noqa: BLE001: the loader's own error, for the consumer
                    self._queue.put(e)
                    return
                if batch is _WAITING:
                    self = None
            deadline = None
            if batch is None:
                room.release()
                self._queue.put(_END)
                return
            try:
                meta = (batch.epoch, batch.batch_in_epoch)
                token = batch.resume_token
                future = self._spec.submit(batch, f"batch {meta[1]} of epoch {meta[0]}")
            except BaseException as e:  # noqa: BLE001
                self._queue.put(e)
                return
            batch = None  # the task holds it: its slot goes back when FN's result no longer refers to it
            self._queue.put((future, meta, token))
            self = future = None

    def _take_once(self, deadline: Optional[float]) -> Any:
        """One slice (<= 0.1 s) of the wait for the inner iterator's next batch: the batch, None at
        the epoch's end, or the feeder's "nothing yet" marker (any object that is neither). Raises
        the loader's timeout past `deadline`."""
        import time

        if self._loader.held_batches >= self._slots:
            # The trainer holds every slot (FN's results keep views): wait for one to come back
            # rather than ask the daemon for a batch it cannot deliver.
            if deadline is not None and time.monotonic() >= deadline:
                self._inner.next(0.0)  # warns that every slot is held and raises the loader's timeout
            time.sleep(0.002)
            return _WAITING
        slice_s = 0.1
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SpdlTimeoutError(
                    f"spdl_client: job {self._job_id} ({self._loader.config_name}): no batch "
                    f"{self._inner.position} of epoch {self.epoch} from spdld within {self._loader.timeout:g} s "
                    "(the loader's timeout; `spdlctl stats` shows where the pipeline waits)"
                )
            slice_s = min(slice_s, left)
        try:
            return self._inner.next(slice_s)
        except SpdlTimeoutError:
            return _WAITING

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()  # a feeder still running ends at its next step

    def _join_feeder(self) -> None:
        feeder, self._feeder = self._feeder, None
        if feeder is not None:
            feeder.join()

    def close(self) -> None:
        """Stops the feeder and drops what was taken ahead (their slots go back). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        while self._feeder is not None and self._feeder.is_alive():
            try:  # make room so a feeder waiting on it sees the stop
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            self._drop(item)
        self._join_feeder()
        while True:
            try:
                self._drop(self._queue.get_nowait())
            except queue.Empty:
                break

    def _drop(self, item) -> None:
        if isinstance(item, tuple):
            future = item[0]
            future.cancel()
            try:
                future.result()  # let a running FN finish: it may hold the batch
            except BaseException:  # noqa: BLE001: dropped with its batch
                pass
            self._room.release()

    def __repr__(self) -> str:
        return f"<spdl_client.TransformIterator epoch={self.epoch} next={self.position} left={len(self)}>"
