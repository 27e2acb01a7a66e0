"""``transform_executor="process"``: the loader's transform FN on N worker processes.

The trainer side of the pool (the worker side: ``_process_worker``). N workers are started once per
Loader, with the ``forkserver`` start method (or ``spawn``; never ``fork``, which would copy a trainer
that may hold CUDA, threads and locks), and live until the loader is closed. For each batch:

- the batch's tensors are *not* copied or pickled: the worker maps the job's shared region once
  (its descriptor is passed over the socket with SCM_RIGHTS) and builds numpy views of the slot
  from (offset, shape, dtype); the trainer keeps the Batch, and so the slot, leased until the
  worker has replied;
- FN's result comes back pickled (protocol 5); its large buffers (numpy arrays, CPU torch
  tensors, >= 64 KiB) go through one shared-memory file (memfd) written once by the worker and
  mapped by the trainer, so the arrays the trainer gets are views of that memory (no second copy);
- a worker is sent at most 2 batches ahead of its answers (one running, the next waiting in its
  socket, so it never idles waiting for the trainer to hear of the first); results are handed
  back through futures that the TransformIterator consumes in batch order, so order is kept
  whatever finishes first.

Failures:

- FN raises: the exception (pickled; else a RuntimeError with its text) comes out of ``next()``
  with the worker's traceback in a note, and the loader is closed, as with threads.
- A worker dies (SIGKILL, the OOM killer, a crash in native code, ``os._exit``): ``next()`` raises
  :class:`TransformWorkerError` naming the batch it was running and how the worker died (a batch
  it had not started yet goes to another worker); a replacement worker is started at once, and the
  loader *continues*: the next ``next()`` yields
  the following batch (the lost batch is skipped; ``state_dict()`` counts it as consumed).
- A worker that cannot start (FN does not unpickle there, or the worker dies before it is ready)
  breaks the pool: every batch raises TransformWorkerError with the reason, and the loader is closed.

Lifetime: the workers exit when the loader is closed (or garbage collected), and by themselves
when the trainer's end of their socket closes, so a trainer killed with SIGKILL leaves no worker
behind (a worker inside FN exits when FN returns).

Thread safety: submit() is called from the loader's feeder thread, shutdown() from the thread
closing the loader; the pool's own collector thread reads the replies. State is guarded by one lock.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import weakref
from collections import deque
from multiprocessing import reduction
from typing import Any, Optional

from . import _process_worker
from ._errors import SpdlError

START_METHODS = ("forkserver", "spawn")
PER_WORKER = 2  # tasks sent to one worker ahead of its answers


class TransformWorkerError(SpdlError):
    """A transform worker process died while it ran FN on a batch (``code`` ``"ABORTED"``), or the
    pool could not start one (``code`` ``"FAILED_PRECONDITION"``). The message names the batch and
    how the worker died. After a death the loader continues with the next batch; after a start
    failure it is closed."""

    def __init__(self, message: str, code: str = "ABORTED") -> None:
        super().__init__(message, code)


TransformWorkerError.__module__ = "spdl_client"


def resolve_context(executor: Any) -> multiprocessing.context.BaseContext:
    """The multiprocessing context of ``transform_executor``: "process" (forkserver), or a context
    object whose start method is forkserver or spawn."""
    if executor == "process":
        return multiprocessing.get_context("forkserver")
    if isinstance(executor, multiprocessing.context.BaseContext):
        method = executor.get_start_method()
        if method not in START_METHODS:
            raise ValueError(
                f"transform_executor: a multiprocessing context with start method {method!r}; only "
                f"{' or '.join(START_METHODS)} (fork would copy the trainer's threads, locks and CUDA state)"
            )
        return executor
    raise ValueError(
        f"transform_executor must be 'thread', 'process' or a multiprocessing context (forkserver or spawn), "
        f"not {executor!r}"
    )


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "closed its connection"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


class _Task:
    __slots__ = ("id", "batch", "desc", "region", "future", "what", "running")

    def __init__(self, task_id: int, batch: Any, desc: dict, region: "_Region", what: str) -> None:
        self.id = task_id
        self.batch = batch  # held until the worker replies: the slot stays leased
        self.desc = desc
        self.region = region
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.what = what
        self.running = False  # its future was set running (it cannot be cancelled any more)


class _Region:
    """The job's shared region as the pool hands it to workers: an id, a descriptor of our own
    (a dup, closed when the region is replaced or the pool shuts down), its size and address."""

    __slots__ = ("id", "fd", "size", "address")

    def __init__(self, region_id: int, fd: int, size: int, address: int) -> None:
        self.id, self.fd, self.size, self.address = region_id, fd, size, address


class _Worker:
    __slots__ = ("process", "conn", "pid", "ready", "tasks", "dead", "region_id")

    def __init__(self, process, conn) -> None:
        self.process = process
        self.conn = conn
        self.pid: int = process.pid
        self.ready = False
        # Sent and not answered, oldest first: the first is running, the next waits in the worker's
        # socket (so the worker starts it without waiting for the trainer to hear of the first).
        self.tasks: deque = deque()
        self.dead = False  # a send failed: it is gone, the collector buries it
        self.region_id = -1  # the region it has mapped


class _State:
    """Everything the collector thread needs (the pool facade can then be collected)."""

    def __init__(self, ctx, workers: int, kind: str, fn_bytes: bytes, name: str) -> None:
        self.ctx = ctx
        self.n = workers
        self.kind = kind
        self.fn_bytes = fn_bytes
        self.name = name
        self.lock = threading.RLock()  # re-entrant: a GC pass inside a locked section may run shutdown()
        self.workers: list[_Worker] = []
        self.pending: deque = deque()
        self.region: Optional[_Region] = None
        self.old_fds: list[int] = []
        self.next_task = 0
        self.next_region = 0
        self.broken: Optional[str] = None
        self.closed = False
        self.restarts = 0
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.collector: Optional[threading.Thread] = None

    # ---- workers ----

    def start_worker(self) -> _Worker:
        """Starts one worker and queues its init message. REQUIRES: lock held."""
        parent, child = self.ctx.Pipe(duplex=True)
        process = self.ctx.Process(target=_process_worker.main, args=(child,), name=f"{self.name}-worker",
                                   daemon=True)
        try:
            process.start()
        finally:
            child.close()  # the worker's end lives in the worker only: its death reads as EOF here
        w = _Worker(process, parent)
        try:
            parent.send(("init", self.kind, self.fn_bytes))
        except OSError:
            pass  # it died already: the collector sees it
        self.workers.append(w)
        self._wake()
        return w

    def _wake(self) -> None:
        try:
            os.write(self.wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def dispatch(self) -> None:
        """Hands pending tasks to workers: an idle one first (the one idle longest), else one with a
        single task (at most PER_WORKER each). REQUIRES: lock held."""
        if self.broken is not None:
            self.break_pool(self.broken)
            return
        while self.pending and not self.closed:
            live = [w for w in self.workers if not w.dead]
            idle = next((w for w in live if not w.tasks), None)
            if idle is None:
                idle = next((w for w in live if len(w.tasks) < PER_WORKER), None)
            if idle is None:
                return
            task = self.pending.popleft()
            if not task.running:
                if not task.future.set_running_or_notify_cancel():  # cancelled (the loader dropped it)
                    task.batch = None
                    continue
                task.running = True
            try:
                if idle.region_id != task.region.id:
                    idle.conn.send(("region", task.region.id, task.region.size))
                    reduction.send_handle(idle.conn, task.region.fd, idle.pid)
                    idle.region_id = task.region.id
                idle.conn.send(("task", task.id, task.desc))
            except OSError:
                # The worker is gone before it got the task: the task goes back to the front, and
                # the collector replaces the worker (seen as EOF / its sentinel).
                self.pending.appendleft(task)  # (running already: it cannot be cancelled any more)
                idle.dead = True
                continue
            idle.tasks.append(task)
            self.workers.remove(idle)  # to the back: the next batch goes to the worker idle longest
            self.workers.append(idle)

    def worker_died(self, w: _Worker) -> None:
        """`w` is gone: fail its batch, replace it. REQUIRES: lock held."""
        self.workers.remove(w)
        try:
            w.conn.close()
        except OSError:
            pass
        w.process.join(timeout=1.0)
        how = _describe_exit(w.process.exitcode)
        tasks, w.tasks = list(w.tasks), deque()
        task = tasks[0] if tasks else None  # the one it was running
        for queued in reversed(tasks[1:]):  # never started: another worker runs them, in order
            self.pending.appendleft(queued)
        if not w.ready:
            # It never got going (an import fails in the new interpreter, or it was killed at once):
            # restarting would likely fail the same way. Every batch fails; the loader closes.
            self.break_pool(f"transform worker pid {w.pid} {how} before it was ready (see its stderr)")
        if task is not None:
            if self.broken is not None:
                self._fail(task, TransformWorkerError(f"spdl_client: {self.broken}; {task.what} was not transformed",
                                                      "FAILED_PRECONDITION"))
            else:
                self._fail(task, TransformWorkerError(
                    f"spdl_client: transform worker pid {w.pid} {how} while it ran the transform on {task.what}: "
                    "that batch is lost; a new worker was started and the loader continues with the next batch"))
        if self.broken is not None:
            self.break_pool(self.broken)  # what waits (e.g. sent back from a dead worker) fails too
        elif not self.closed:
            self.restarts += 1
            self.start_worker()
            self.dispatch()

    def break_pool(self, reason: str) -> None:
        """REQUIRES: lock held."""
        if self.broken is None:
            self.broken = reason
        while self.pending:
            task = self.pending.popleft()
            self._fail(task, TransformWorkerError(f"spdl_client: {self.broken}; {task.what} was not transformed",
                                                  "FAILED_PRECONDITION"))

    @staticmethod
    def _fail(task: _Task, e: BaseException) -> None:
        task.batch = None
        _settle(task.future, error=e)

    # ---- the collector thread ----

    def collect(self) -> None:
        while True:
            with self.lock:
                if self.closed:
                    return
                waitables = [self.wake_r]
                for w in self.workers:
                    waitables.append(w.conn)
                    waitables.append(w.process.sentinel)
            ready = multiprocessing.connection.wait(waitables)
            with self.lock:
                if self.closed:
                    return
                if self.wake_r in ready:
                    try:
                        while os.read(self.wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                for w in list(self.workers):
                    if w.conn in ready:
                        self._read(w)
                    elif w.process.sentinel in ready and w in self.workers:
                        self._drain_then_bury(w)

    def _read(self, w: _Worker) -> None:
        """One message from `w` (REQUIRES: lock held; `w.conn` readable)."""
        try:
            msg = w.conn.recv()
            if msg[0] == "ok":
                _, task_id, data, layout = msg
                fd = reduction.recv_handle(w.conn) if layout else -1
        except (EOFError, OSError, pickle.UnpicklingError):
            self.worker_died(w)
            return
        kind = msg[0]
        if kind == "ready":
            w.ready = True
            return
        if kind == "init_error":
            err = _rebuild_error(msg[1], f"transform worker pid {w.pid} could not load the transform")
            self.break_pool(f"transform worker pid {w.pid} could not load the transform function: {err!r}")
            w.ready = True  # a clean refusal, not a crash: no restart loop
            return
        task = w.tasks.popleft() if w.tasks else None
        if task is None or task.id != msg[1]:
            if kind == "ok" and fd >= 0:
                os.close(fd)
            self.break_pool(f"transform worker pid {w.pid} answered a task it was not given (a bug)")
            if task is not None:
                self._fail(task, TransformWorkerError(f"spdl_client: {self.broken}", "INTERNAL"))
            return
        task.batch = None  # the worker is done with the slot: it may go back to the daemon
        if kind == "ok":
            try:
                result = _process_worker.unpack_result(data, layout, fd)
            except BaseException as e:  # noqa: BLE001: e.g. unpickling needs a module the trainer lacks
                _settle(task.future, error=e)
            else:
                _settle(task.future, result=result)
        else:
            _settle(task.future, error=_rebuild_error(msg[2], f"in transform worker pid {w.pid}"))
        self.dispatch()

    def _drain_then_bury(self, w: _Worker) -> None:
        """`w`'s process ended: read what it sent before dying, then treat it as dead."""
        while w in self.workers:
            try:
                if not w.conn.poll(0):
                    break
            except OSError:
                break
            self._read(w)
        if w in self.workers:
            self.worker_died(w)

    # ---- shutdown ----

    def shutdown(self, timeout: float = 5.0) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            workers, self.workers = self.workers, []
            pending, self.pending = list(self.pending), deque()
            region, self.region = self.region, None
            old, self.old_fds = self.old_fds, []
            self._wake()
        for task in pending:
            task.batch = None
            task.future.cancel()
        for w in workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in workers:
            w.process.join(timeout)
            if w.process.exitcode is None:
                w.process.terminate()
                w.process.join(1.0)
            if w.process.exitcode is None:
                w.process.kill()
                w.process.join(1.0)
            try:
                w.conn.close()
            except OSError:
                pass
            for task in w.tasks:
                self._fail(task, TransformWorkerError("spdl_client: the loader was closed", "CANCELLED"))
            w.tasks.clear()
        collector = self.collector
        if collector is not None and collector is not threading.current_thread():
            collector.join(timeout)
        for fd in [region.fd] if region is not None else []:
            os.close(fd)
        for fd in old:
            os.close(fd)
        os.close(self.wake_r)
        os.close(self.wake_w)


def _settle(future: concurrent.futures.Future, result: Any = None, error: Optional[BaseException] = None) -> None:
    """Completes `future` unless it is done already (cancelled by the loader)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass




def _rebuild_error(packed: tuple, where: str) -> BaseException:
    data, type_name, text, tb = packed
    e: Optional[BaseException] = None
    if data is not None:
        try:
            e = pickle.loads(data)
        except Exception:  # noqa: BLE001
            e = None
    if not isinstance(e, BaseException):
        e = RuntimeError(f"{type_name}: {text}")
    note = f"{where}:\n{tb.rstrip()}"
    if hasattr(e, "add_note"):
        e.add_note(note)
    else:  # Python < 3.11
        e.__notes__ = getattr(e, "__notes__", []) + [note]
    return e


def pickle_fn(fn: Any) -> bytes:
    """FN pickled for the workers (by reference for a function), or TypeError saying why not."""
    try:
        return pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001: pickle raises several kinds
        raise TypeError(
            f"transform_executor='process' sends the transform to worker processes by pickling it, and "
            f"{fn!r} does not pickle ({e}): use a function defined at module level (not a lambda or a "
            "local function) or a picklable callable object"
        ) from None


class ProcessTransformPool:
    """N transform worker processes for one Loader (see the module docstring).

    ``submit(batch, what)`` returns a Future of FN's result on that batch; ``set_region`` must have
    named the job's shared region first; ``shutdown()`` stops the workers (idempotent; also run when
    the pool is garbage collected)."""

    def __init__(self, fn_bytes: bytes, kind: str, workers: int, executor: Any) -> None:
        if workers < 1:
            raise ValueError(f"transform_executor='process' needs transform_workers >= 1, not {workers}")
        ctx = resolve_context(executor)
        self._state = _State(ctx, workers, kind, fn_bytes, "spdl-transform")
        st = self._state
        with st.lock:
            for _ in range(workers):
                st.start_worker()
        st.collector = threading.Thread(target=st.collect, name="spdl-transform-collector", daemon=True)
        st.collector.start()
        self._finalizer = weakref.finalize(self, st.shutdown)

    @property
    def pids(self) -> list:
        """The live workers' process ids."""
        with self._state.lock:
            return [w.pid for w in self._state.workers]

    @property
    def restarts(self) -> int:
        """Workers started to replace dead ones."""
        return self._state.restarts

    def set_region(self, fd: int, size: int, address: int) -> None:
        """The job's (new) shared region: `fd` is duplicated (the caller keeps its own)."""
        st = self._state
        dup = os.dup(fd)
        with st.lock:
            if st.closed:
                os.close(dup)
                return
            st.next_region += 1
            if st.region is not None:
                st.old_fds.append(st.region.fd)  # tasks of the old region may still be queued
            st.region = _Region(st.next_region, dup, size, address)
            if not st.pending and not any(w.tasks for w in st.workers):
                for old in st.old_fds:
                    os.close(old)
                st.old_fds = []

    def submit(self, batch: Any, what: str) -> concurrent.futures.Future:
        """FN on `batch` in a worker, as a Future; the batch is held until the worker is done."""
        st = self._state
        with st.lock:
            region = st.region
            if st.closed:
                raise SpdlError("spdl_client: the transform pool was shut down", "FAILED_PRECONDITION")
            if region is None:
                raise SpdlError("spdl_client: the transform pool has no region (a bug)", "INTERNAL")
            tensors = []
            for name, t in batch.items():
                offset = int(t.data_ptr) - region.address
                if not 0 <= offset <= region.size - int(t.nbytes):
                    raise SpdlError(f"spdl_client: tensor {name!r} of {what} lies outside the job's region",
                                    "INTERNAL")
                tensors.append((name, offset, tuple(t.shape), str(t.dtype)))
            desc = {
                "tensors": tensors, "epoch": batch.epoch, "batch_in_epoch": batch.batch_in_epoch, "seq": batch.seq,
                "rows": batch.rows, "slot": batch.slot, "paths": list(batch.paths), "labels": list(batch.labels),
                "seed": batch.seed, "resume_token": batch.resume_token,
            }
            st.next_task += 1
            task = _Task(st.next_task, batch, desc, region, what)
            if st.broken is not None:
                st._fail(task, TransformWorkerError(f"spdl_client: {st.broken}; {what} was not transformed",
                                                    "FAILED_PRECONDITION"))
                return task.future
            st.pending.append(task)
            st.dispatch()
            return task.future

    def shutdown(self) -> None:
        self._finalizer()
