"""Loader and Batch: the Python API over the C++ client library (see the package docstring)."""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Optional, Union

from . import _spdl_client as _native
from . import _transforms
from ._errors import SpdlError, SpdlTimeoutError

__all__ = ["Loader", "EpochIterator", "Batch", "Tensor", "DEFAULT_SOCKET", "DEFAULT_TIMEOUT"]

Tensor = _native.Tensor

#: Where the packaged daemon listens (systemd/spdld.service); $SPDLD_SOCKET overrides it.
DEFAULT_SOCKET = "/run/spdld/spdld.sock"

ConfigLike = Union[str, "os.PathLike[str]", Mapping[str, Any]]
OverridesLike = Union[Mapping[str, Any], Iterable[Union[str, tuple]], None]


class Batch(Mapping):
    """One batch: a read-only mapping of tensor name to :class:`Tensor` (``"image"``, ``"label"``).

    Jobs with targets carry more tensors, by name: a ``source.type: coco`` job ``"boxes"`` float32
    [B, max_boxes, 4] (x1, y1, x2, y2 in output pixels), ``"box_labels"`` int64 [B, max_boxes] and
    ``"box_count"`` int32 [B] (rows past the count are zero); a job with a mask (``mask.from`` or
    ``source.masks``) ``"mask"`` uint8 [B, H, W]; a job with ``mix`` has ``"label"`` as float32
    [B, num_classes] soft targets (``labels`` below still lists each row's own class).

    The tensors are zero-copy views of one slot of the job's shared ring. Take them with
    ``torch.from_dlpack(batch["image"])`` or ``numpy.from_dlpack(...)`` (or :meth:`torch`,
    :meth:`numpy`); what you get shares the memory.

    **Lifetime.** The slot stays leased (the daemon cannot refill it) while anything refers to it:
    this Batch, one of its Tensor objects, or a torch/numpy view taken from one. When the last of
    them is gone, the slot goes back to the daemon — from whichever thread drops it (e.g. the GC).
    :meth:`release` ends this Batch's own claim at once (this object and its Tensor objects can no
    longer export views), but never frees memory under a live view: a view exported before
    ``release()`` keeps the slot until that view dies. So ``release()`` is always safe, and a slot
    comes back exactly when nothing can read it any more. Keep at most ``prefetch - 1`` batches (or
    views of them) alive while iterating, or the loader waits for a slot that never comes back (it
    warns with a RuntimeWarning when ``next()`` is called with every slot held).

    Attributes: ``epoch`` (0-based), ``batch_in_epoch`` (0-based), ``seq`` (batch number since the
    job started), ``rows`` (valid rows: the batch size, fewer only for a last partial batch),
    ``slot``, ``paths`` (each row's path relative to ``source.root``), ``labels`` (each row's
    label, as a list; the same values as the ``"label"`` tensor), ``seed`` (a 64-bit seed for
    randomness in a transform: a pure function of (``sampler.seed``, epoch, batch index), so a rerun
    or a resumed job draws the same; None when the loader cannot read ``sampler.seed``, i.e. YAML
    config text without PyYAML), ``resume_token`` (bytes: the daemon's position after this batch),
    ``metadata`` and ``offsets`` (a stream job: each row's metadata bytes from its producer and its
    stream offset; empty lists for other sources).
    """

    __slots__ = ("_tensors", "epoch", "batch_in_epoch", "seq", "rows", "slot", "paths", "labels", "seed",
                 "resume_token", "metadata", "offsets", "_released")

    def __init__(self, tensors: list, meta: dict) -> None:
        self._tensors = {t.name: t for t in tensors}
        self.epoch: int = meta["epoch"]
        self.batch_in_epoch: int = meta["batch_in_epoch"]
        self.seq: int = meta["seq"]
        self.rows: int = meta["rows"]
        self.slot: int = meta["slot"]
        self.paths: list[str] = meta["paths"]
        self.labels: list[int] = meta["labels"]
        self.seed: Optional[int] = meta.get("seed")
        self.resume_token: bytes = meta.get("resume_token", b"")
        self.metadata: list[bytes] = meta.get("metadata", [])
        self.offsets: list[int] = meta.get("offsets", [])
        self._released = False

    # Mapping
    def __getitem__(self, name: str) -> Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def release(self) -> None:
        """Ends this batch's claim on its slot (idempotent); see the class docstring.

        Views already exported (torch/numpy) stay valid and keep the slot until they die; this
        Batch's Tensor objects can no longer export new ones (they raise SpdlError).
        """
        if self._released:
            return
        self._released = True
        for t in self._tensors.values():
            t.release_()

    @property
    def released(self) -> bool:
        return self._released

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def torch(self) -> dict:
        """``{name: torch.from_dlpack(tensor)}``: zero-copy torch tensors (imports torch)."""
        import torch

        return {name: torch.from_dlpack(t) for name, t in self._tensors.items()}

    def numpy(self) -> dict:
        """``{name: numpy.from_dlpack(tensor)}``: zero-copy numpy arrays."""
        import numpy

        return {name: numpy.from_dlpack(t) for name, t in self._tensors.items()}

    def __repr__(self) -> str:
        tensors = ", ".join(f"{n}: {t.dtype}{list(t.shape)}" for n, t in self._tensors.items())
        state = " released" if self._released else ""
        return f"<spdl_client.Batch epoch={self.epoch} batch_in_epoch={self.batch_in_epoch} rows={self.rows} {{{tensors}}}{state}>"


#: The default ``timeout`` of a Loader's waits for the daemon, in seconds (``Loader(timeout=...)``).
DEFAULT_TIMEOUT = 300.0

_DEFAULT: Any = object()  # "the loader's own timeout"


class EpochIterator:
    """One epoch of a :class:`Loader`'s batches: what ``iter(loader)`` returns.

    Yields the epoch's :class:`Batch` objects in order and stops at the epoch's end. ``len(it)`` is
    the number of batches it has still to yield. ``it.next(timeout=...)`` is ``next(it)`` with its
    own timeout (None at the epoch's end). Only the loader's latest iterator may be used: a later
    ``iter(loader)``, :meth:`Loader.set_epoch` to another epoch, :meth:`Loader.load_state_dict` or
    :meth:`Loader.close` ends this one (it then raises SpdlError ``FAILED_PRECONDITION``).
    """

    __slots__ = ("_loader", "_cursor")

    def __init__(self, loader: "Loader", cursor: "_Cursor") -> None:
        # The iterator keeps its loader alive (``for b in Loader(...)``); the loader keeps only the
        # cursor, so that no reference cycle delays the job's end until a garbage collection.
        self._loader = loader
        self._cursor = cursor

    @property
    def epoch(self) -> int:
        """The epoch it yields."""
        return self._cursor.epoch

    @property
    def start(self) -> int:
        """batch_in_epoch of its first batch (> 0 after a mid-epoch resume)."""
        return self._cursor.start

    @property
    def position(self) -> int:
        """batch_in_epoch of the next batch."""
        return self._cursor.start + self._cursor.yielded

    def __iter__(self) -> "EpochIterator":
        return self

    def __len__(self) -> int:
        return 0 if self._cursor.done else max(0, len(self._loader) - self.position)

    def __next__(self) -> Batch:
        batch = self.next()
        if batch is None:
            raise StopIteration
        return batch

    def next(self, timeout: Optional[float] = _DEFAULT) -> Optional[Batch]:
        """The epoch's next batch, or None at its end; waits at most ``timeout`` seconds (default: the
        loader's; None: no limit), then raises :class:`SpdlTimeoutError` (nothing is lost)."""
        if self._cursor.done:
            return None
        if self._loader._cursor is not self._cursor:
            raise SpdlError(
                f"spdl_client: this iterator of epoch {self.epoch} is no longer the loader's (a later iter(loader), "
                "set_epoch, load_state_dict, end or close came after it): the rest of its epoch was dropped",
                "FAILED_PRECONDITION",
            )
        batch = self._loader._next_batch(self, timeout)
        if batch is None:
            self._cursor.done = True
            return None
        self._cursor.yielded += 1
        return batch

    def __repr__(self) -> str:
        return f"<spdl_client.EpochIterator epoch={self.epoch} next={self.position} left={len(self)}>"


class _Cursor:
    """Where an epoch's iterator is: shared by the EpochIterator and its Loader."""

    __slots__ = ("epoch", "start", "yielded", "done")

    def __init__(self, epoch: int, start: int) -> None:
        self.epoch = epoch
        self.start = start
        self.yielded = 0
        self.done = False


class Loader:
    """One job on the node's spdld daemon, iterated like ``torch.utils.data.DataLoader``.

    ``Loader(config, *, socket=None, rank=None, world_size=None, device=None, overrides=None,
    epochs=None, timeout=300.0)``

    - ``config``: the job config: a path (str or PathLike) to a YAML file, the YAML text itself (a
      str that is not an existing file and contains a newline or ':'), or a dict (any Mapping) of
      the same structure (sent as JSON, which is YAML).
    - ``socket``: the daemon's control socket; default ``$SPDLD_SOCKET``, else
      ``/run/spdld/spdld.sock``.
    - ``rank`` / ``world_size``: this trainer's place among the job's ranks; default the
      ``RANK`` / ``WORLD_SIZE`` environment variables that torchrun sets, else 0 / 1.
    - ``device``: for a GPU job (``output.device: cuda`` or ``cuda:N``), the GPU to deliver to:
      ``"cuda:N"``, ``N`` or a ``torch.device`` (``"cpu"`` makes it a CPU job). Default: under
      torchrun (``$LOCAL_RANK`` set), ``cuda:$LOCAL_RANK`` for a job whose config asks for a GPU;
      else the config's own ``output.device``. An ``output.device`` in ``overrides`` wins too.
    - ``overrides``: config values to change before validation, as a dict
      ``{"source.root": "/data", "batch.size": 64}`` or a list of ``"key.path=value"`` strings
      (values are YAML, as with ``spdl-client --set``).
    - ``epochs``: how many epochs the job may run; None (or 0): as many as the trainer iterates.
    - ``timeout``: the longest wait, in seconds, for the daemon to accept the job and for each
      batch (None: no limit); past it a :class:`SpdlTimeoutError` names the job and what it waited for.
    - ``transform``: FN(batch) -> anything: called once per batch with the :class:`Batch`; the
      loader yields what it returns (a dict of tensors, a tuple, any object), in batch order.
      Randomness: draw from ``batch.seed``. Whatever FN keeps (a view of the batch's tensors) keeps
      the batch's slot leased, as a Batch does; an FN that copies frees the slot as soon as it
      returns. An exception in FN comes out of ``next()`` as itself with a note naming the batch's
      epoch and index, and the loader is closed (no slot or thread left behind). With a GPU job FN
      receives the GPU batch (e.g. for torchvision.transforms.v2 on the GPU).
    - ``sample_transform``: FN(sample) -> dict of arrays, instead of ``transform``: called per row
      with ``{tensor name: a numpy view of the row (torch for a GPU job), "path": str, "label":
      int, "seed": the row's seed, from batch.seed}``; every call returns the same keys with one fixed shape per key, and the loader yields
      the results stacked into new tensors (torch when FN returns torch tensors, else numpy); the
      batch's slot goes back at once. Cost: one Python call per sample and a copy of every result,
      against one call per batch for ``transform`` (prefer it when FN can work on whole batches).
    - ``transform_threads``: how many threads run FN (default 0: inline in ``next()``). With N > 0
      FN runs on N threads ahead of consumption, at most ``prefetch - 1`` batches ahead (so the
      daemon never has more batches out than slots; give the job ``prefetch >= N + 1``), results
      still in batch order. On a free-threaded Python the N calls run in parallel; with the GIL, as
      far as FN releases it (torch, numpy, I/O).
    - ``transform_workers``: ``transform_threads``' general name (give one of them): the number of
      workers running FN.
    - ``transform_executor``: ``"thread"`` (default: threads of this process, as above),
      ``"process"`` (``transform_workers`` >= 1 worker processes, started once with the forkserver
      method) or a ``multiprocessing`` context (forkserver or spawn; fork is refused). Processes
      suit an FN that holds the GIL (pure Python); FN must pickle (a module-level function) and
      gets a WorkerBatch: the Batch's metadata and ``{name: numpy array}`` views of the slot, which
      the worker maps itself (no copy of the input). Results come back pickled, large arrays
      through shared memory; an exception in FN closes the loader as with threads; a worker that
      dies (e.g. SIGKILL) makes ``next()`` raise :class:`TransformWorkerError` naming the batch,
      a new worker is started and the loader continues with the next batch. The workers exit with
      the loader. CPU jobs only.

    Iteration is a DataLoader's: ``iter(loader)`` yields exactly one epoch (an
    :class:`EpochIterator`), ``len(loader)`` is the batches of one epoch for this rank, and the next
    ``iter(loader)`` yields the next epoch. The job keeps running between epochs (the daemon
    prefetches the next one while the trainer validates). :meth:`set_epoch` (like
    ``DistributedSampler.set_epoch``) chooses the epoch the next ``iter()`` yields. Breaking out of an
    epoch and iterating again drops the rest of that epoch. Epoch ends are recorded in
    :attr:`epoch_summaries`.

    Threads: use a Loader from one thread at a time (calls from several threads are serialized;
    :meth:`close` refuses while another thread waits for a batch). Waits release the GIL, and Ctrl-C
    interrupts them (KeyboardInterrupt within ~0.1 s; the loader stays usable). Batches and their
    views may be dropped on any thread. A Batch may outlive its Loader (its memory stays mapped), but
    once the loader is closed the daemon no longer protects it: copy what you need first.

    Closing (:meth:`close`, the end of a ``with`` block, or the Loader being garbage collected)
    disconnects, which ends the job on the daemon.
    """

    def __init__(
        self,
        config: ConfigLike,
        *,
        socket: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        device: Any = None,
        overrides: OverridesLike = None,
        epochs: Optional[int] = None,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        client_name: Optional[str] = None,
        transform: Optional[Any] = None,
        sample_transform: Optional[Any] = None,
        transform_threads: int = 0,
        transform_workers: Optional[int] = None,
        transform_executor: Any = "thread",
    ) -> None:
        self._core = None  # first, so that close() works even if the rest fails
        self._cursor: Optional[_Cursor] = None  # the latest EpochIterator's
        # The epoch's TransformIterator (with a transform): state_dict() reports what it yielded, also
        # after a break. It refers to the loader, so a dropped loader with a transform ends its job
        # at the next GC pass (or at close()), not at once.
        self._titer: Optional[_transforms.TransformIterator] = None
        self._transform = _transforms.TransformSpec(
            transform, sample_transform, _resolve_workers(transform_threads, transform_workers, transform_executor),
            transform_executor)
        yaml_text, config_name, parsed = _read_config(config)
        self.socket: str = _resolve_socket(socket)
        self.rank, self.world_size = _resolve_rank(rank, world_size)
        self.epochs: Optional[int] = _resolve_epochs(epochs)
        #: The default timeout of every wait, in seconds (None: no limit); may be changed.
        self.timeout: Optional[float] = _resolve_timeout(timeout)
        self.overrides: list = _resolve_overrides(overrides)
        dev = _resolve_device(device, self.overrides, yaml_text, parsed)
        if dev is not None:
            self.overrides.append(("output.device", dev))
        self._device_uuid: bytes = _trainer_device_uuid(self.overrides, yaml_text, parsed)
        self.config_name: str = config_name
        if client_name is None:
            client_name = f"spdl_client (python) pid={os.getpid()} rank={self.rank}/{self.world_size}"
        self._yaml_text = yaml_text
        self._client_name = client_name
        self._sampler_seed: Optional[int] = _sampler_seed(yaml_text, parsed, self.overrides)
        self._finished = False
        self._job_stats: Optional[dict] = None
        self.epoch_summaries: list[dict] = []
        self._batches_seen = 0
        self._samples_seen = 0
        # The epoch the next iter() yields, and the batch it starts at (> 0 only after a mid-epoch
        # load_state_dict).
        self._epoch = 0
        self._start_batch = 0
        self._open((0, 0), b"", self.timeout)
        if self._transform.process:
            try:
                self._transform.start(self._device)
                self._share_region()
            except BaseException:
                self.close()
                raise

    # ---- the job on the daemon ----

    def _open(self, at: tuple, token: bytes, timeout: Optional[float]) -> None:
        """(Re)opens the job so that its next batch is ``at`` = (epoch, batch_in_epoch): from
        ``token`` when given, else from the start of epoch ``at[0]``. Ends the job open before."""
        self._detach_iterator()
        old, self._core = self._core, None
        if old is not None:
            old.close()
        try:
            self._core = _native.Core.open(
                self.socket, self._yaml_text, self.config_name, self.overrides, self.rank, self.world_size,
                self.epochs or 0, self._client_name, token, 0 if token else at[0], timeout, self._device_uuid,
            )
        except SpdlTimeoutError:
            raise SpdlTimeoutError(
                f"spdl_client: spdld at {self.socket} did not accept the job ({self.config_name}, rank "
                f"{self.rank}/{self.world_size}) within {timeout:g} s: is the daemon overloaded, or its "
                "dataset scan slow? Pass a longer timeout= (None: no limit)"
            ) from None
        self._info: dict = self._core.info
        self._device: str = self._core.device
        self._share_region()
        self._open_token = token  # the position's token until a batch brings a newer one
        self._stream = tuple(at)  # (epoch, batch_in_epoch) of the next batch the job delivers
        self._finished = False
        self._job_stats = None

    def _share_region(self) -> None:
        """Hands the job's shared region to the transform processes, if any."""
        if self._transform.processes is not None and self._core is not None:
            core = self._core
            self._transform.set_region(core.region_fd, core.region_size, core.region_address)

    def _detach_iterator(self) -> None:
        titer, self._titer = getattr(self, "_titer", None), None
        if titer is not None:
            titer.close()  # stops its feeder and drops the batches it took ahead
        self._cursor = None

    def _close_after_transform_error(self) -> None:
        """The transform raised: stop everything and end the job (the error goes on to the caller)."""
        self.close()

    def _resolve_wait(self, timeout: Any) -> Optional[float]:
        return self.timeout if timeout is _DEFAULT else _resolve_timeout(timeout)

    def _next_event(self, timeout: Any, what: str) -> tuple:
        """The job's next event, with the position, the summaries and the stats kept up to date."""
        t = self._resolve_wait(timeout)
        ev = self._open_core().next(t)
        if ev is None:
            job = self._info["job_id"]
            raise SpdlTimeoutError(
                f"spdl_client: job {job} ({self.config_name}, rank {self.rank}/{self.world_size}) on "
                f"{self.socket}: no {what} from spdld within {t:g} s. The daemon is alive but delivered nothing "
                "in that time (a stalled source: an unanswering HTTP server, a hung file system; or a pipeline "
                f"far slower than the trainer: `spdlctl stats {job}` shows where it waits). Nothing was lost: "
                "call again to keep waiting (it.next(timeout=...)), or pass a longer Loader(timeout=...) "
                "(None: no limit)."
            )
        kind, a, b = ev
        if kind == "batch":
            self._stream = (b["epoch"], b["batch_in_epoch"] + 1)
        elif kind == "epoch_end":
            self.epoch_summaries.append(a)
            self._stream = (a["epoch"] + 1, 0)
            if not a.get("samples") and a.get("skipped"):
                # Every sample of the epoch failed: an empty epoch is not a success.
                raise SpdlError(
                    f"epoch {a['epoch']} ended without delivering a single sample ({a['skipped']} skipped)",
                    "DATA_LOSS",
                )
        else:
            a["epochs"] = list(self.epoch_summaries)
            self._job_stats = a
            self._finished = True
            if not a.get("samples"):
                # A job that ended without delivering anything did not do its work.
                raise SpdlError(
                    f"the job ended without delivering a single sample ({a.get('skipped', 0)} skipped)", "DATA_LOSS"
                )
        return kind, a, b

    # ---- iteration ----

    def __iter__(self) -> EpochIterator:
        """One epoch: the one :meth:`set_epoch` chose, else the one after the previous ``iter()``'s.
        A previous iterator still running is ended (the rest of its epoch is dropped). With a
        transform, a TransformIterator yielding FN's results (same attributes and len())."""
        self._open_core()
        self._detach_iterator()
        epoch, start = self._epoch, self._start_batch
        if self.epochs is not None and epoch >= self.epochs:
            raise SpdlError(
                f"spdl_client: epoch {epoch} is past the job's epochs={self.epochs} (epochs 0..{self.epochs - 1} "
                "were iterated or skipped); open the Loader with more epochs, or epochs=None for as many as "
                "you iterate",
                "FAILED_PRECONDITION",
            )
        if self._finished:
            raise SpdlError("spdl_client: the job has ended (end() was called): no more epochs", "FAILED_PRECONDITION")
        self._reposition(epoch, start)
        self._cursor = _Cursor(epoch, start)
        it = EpochIterator(self, self._cursor)
        self._epoch, self._start_batch = epoch + 1, 0
        if self._transform.active:
            self._titer = _transforms.TransformIterator(self, it, self._transform, int(self._info["num_slots"]) - 1)
            return self._titer
        return it

    def _reposition(self, epoch: int, start: int) -> None:
        """Makes the job's next batch (epoch, start): it is already, or a few batches are left
        before it (they are read and dropped: their slots go back at once), or the job is reopened
        at the start of that epoch."""
        if self._stream == (epoch, start):
            return
        se, sb = self._stream
        per = len(self)
        if start == 0 and (se, sb) < (epoch, 0):
            left = (per - sb) + (epoch - se - 1) * per
            if left <= int(self._info["num_slots"]):  # prefetched already, or nearly: drain
                while self._stream < (epoch, 0) and not self._finished:
                    self._warn_if_all_slots_held()
                    self._next_event(_DEFAULT, f"the rest of epoch {self._stream[0]} (being dropped)")
                if self._stream == (epoch, 0):
                    return
        if start != 0:
            raise SpdlError(f"spdl_client: cannot start epoch {epoch} at batch {start} without its resume token",
                            "INTERNAL")
        self._open((epoch, 0), b"", self.timeout)

    def _next_batch(self, it: EpochIterator, timeout: Any = _DEFAULT) -> Optional[Batch]:
        """The next batch of ``it``'s epoch, or None at the epoch's end. The one place where the
        iterator's batches are made."""
        self._warn_if_all_slots_held()
        kind, a, b = self._next_event(timeout, f"batch {it.position} of epoch {it.epoch}")
        if kind == "batch":
            if (b["epoch"], b["batch_in_epoch"]) != (it.epoch, it.position):
                raise SpdlError(
                    f"spdl_client: spdld delivered batch {b['batch_in_epoch']} of epoch {b['epoch']} where batch "
                    f"{it.position} of epoch {it.epoch} was due (is the daemon older than this client?)",
                    "INTERNAL",
                )
            if self._sampler_seed is not None:
                b["seed"] = _transforms.batch_seed(self._sampler_seed, b["epoch"], b["batch_in_epoch"])
            batch = Batch(a, b)
            self._batches_seen += 1
            self._samples_seen += batch.rows
            return batch
        if kind == "epoch_end" and self.epochs is not None and a["epoch"] + 1 >= self.epochs:
            self._next_event(timeout, "the job's final statistics")  # the last epoch: JobEnd follows
        return None

    def _warn_if_all_slots_held(self) -> None:
        if self._open_core().held >= self._info["num_slots"]:
            warnings.warn(
                f"spdl_client: all {self._info['num_slots']} slots of the job (prefetch) are held by live "
                "batches or views of them: the next batch waits until one is dropped or released (from another "
                "thread), or until the timeout. Keep at most prefetch - 1 batches alive (e.g. not list(loader)).",
                RuntimeWarning,
                stacklevel=4,
            )

    def __len__(self) -> int:
        """Batches per epoch for this rank (the same on every rank)."""
        return int(self._info["batches_per_epoch"])

    def set_epoch(self, epoch: int) -> None:
        """Makes the next ``iter(loader)`` yield epoch ``epoch`` (its samples in the same order as any
        other run's epoch ``epoch``), like ``DistributedSampler.set_epoch``. The epoch the next
        ``iter()`` yields anyway is a no-op (so the usual ``for e in range(E): loader.set_epoch(e)``
        loop just works, also after a mid-epoch :meth:`load_state_dict`); a later one skips ahead
        (the job is reopened there, or the few batches before it are dropped). An earlier one raises
        ValueError: the loader has moved past it.
        """
        e = int(epoch)
        if e < 0:
            raise ValueError(f"set_epoch({epoch}): epochs count from 0")
        if e == self._epoch:
            return
        if e < self._epoch:
            raise ValueError(
                f"set_epoch({e}): this loader has moved on to epoch {self._epoch} (each iter(loader) yields the next "
                "epoch); going back is not supported. Call set_epoch before iterating the epoch, or open a new Loader "
                "(or load_state_dict) to replay an epoch"
            )
        if self.epochs is not None and e >= self.epochs:
            raise ValueError(f"set_epoch({e}): the loader was opened with epochs={self.epochs}")
        self._detach_iterator()
        self._epoch, self._start_batch = e, 0

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter(loader)`` yields."""
        return self._epoch

    # ---- job ----

    @property
    def device(self) -> str:
        """The job's ``output.device``: ``"cpu"``, or ``"cuda:N"`` when its batches are delivered on
        the GPU. Then every tensor is CUDA memory (``__dlpack_device__`` is ``(kDLCUDA, ordinal)``):
        ``torch.from_dlpack(t)`` gives a CUDA tensor, and the DLPack stream protocol makes the
        consumer's current stream wait on the GPU (no host sync) for the batch's copy; the batch's
        slot is reused only after the work queued on that stream before the tensor died has run."""
        return self._device

    @property
    def info(self) -> dict:
        """What the daemon said when it accepted the job (a copy): ``job_id``, ``batch_size``,
        ``batches_per_epoch``, ``samples_per_epoch`` (this rank), ``dataset_size`` (the whole source),
        ``num_slots`` (prefetch depth), ``classes`` and ``layout`` (per tensor: name, dtype, full-batch
        shape, bytes); plus ``rank``, ``world_size``, ``epochs`` and ``socket`` as opened."""
        d = dict(self._info)
        d["layout"] = [dict(t) for t in self._info["layout"]]
        d["classes"] = list(self._info["classes"])
        d.update(rank=self.rank, world_size=self.world_size, epochs=self.epochs, socket=self.socket)
        return d

    @property
    def classes(self) -> Optional[list]:
        """The class names by label (an image folder's sub-directories, sorted), or None for a source
        without them (lists, shards, URLs)."""
        return list(self._info["classes"]) or None

    @property
    def dataset_size(self) -> int:
        """Samples in the whole source (all ranks)."""
        return int(self._info["dataset_size"])

    @property
    def finished(self) -> bool:
        """Whether the job is done: its last epoch was iterated, or :meth:`end` was called."""
        return self._finished

    @property
    def closed(self) -> bool:
        return self._core is None or self._core.closed

    @property
    def held_batches(self) -> int:
        """Batches of this loader whose slot is still leased: referred to by a Batch, a Tensor or a
        torch/numpy view (at most ``info["num_slots"]``)."""
        return 0 if self._core is None else self._core.held

    def stats(self) -> dict:
        """The job's statistics.

        Once the job is done (:attr:`finished`): the daemon's final figures — ``samples``,
        ``batches``, ``skipped``, ``seconds`` (since the daemon accepted the job),
        ``first_batch_seconds``, ``client_wait_seconds``, ``stages`` (per pipeline stage: ``name``,
        ``kind`` ("io" or "cpu"), then every stage figure the daemon describes for clients, by name:
        ``tasks``, ``failures``, ``busy_seconds``, ``concurrency``, task time ``avg_ms``,
        ``p50_ms``, ``p90_ms``, ``p99_ms``, ``put_wait_seconds``, ``get_wait_seconds``,
        ``items_per_s``, the recent window's ``window_*``, ...), ``cache`` (the node's sample cache: ``hits`` and ``misses`` of this job,
        node-wide ``evictions``, ``bytes``, ``budget_bytes``; all 0 without a cache), ``values``
        (every figure the daemon describes for clients, by name: the above and ``samples_tried``,
        ``samples_failed``, ``samples_per_s``, ``window_samples_per_s``, ``weight``,
        ``share_members``, ``share_group_job_id``, ...; a mix of sources adds ``source_samples.N``,
        the samples delivered from its N-th source; ``spdl_client._spdl_client.stat_fields()`` lists
        every figure with its unit and help) — plus ``epochs`` (the per-epoch summaries)
        and ``finished: True``.

        Before that, the daemon has sent nothing but per-epoch summaries, so ``samples`` and
        ``batches`` count what this loader has yielded so far, ``skipped`` adds up the finished
        epochs' skips, ``seconds``, ``first_batch_seconds`` and ``stages`` are None, and
        ``finished`` is False.
        """
        if self._job_stats is not None:
            return dict(self._job_stats, finished=True)
        return {
            "finished": False,
            "samples": self._samples_seen,
            "batches": self._batches_seen,
            "skipped": sum(e["skipped"] for e in self.epoch_summaries),
            "seconds": None,
            "first_batch_seconds": None,
            "stages": None,
            "cache": None,
            "epochs": list(self.epoch_summaries),
        }

    def end(self, timeout: Optional[float] = _DEFAULT) -> None:
        """Stops the job now and waits (at most ``timeout``) for the daemon's final :meth:`stats`;
        batches in flight are dropped. Afterwards the loader yields no more epochs."""
        core = self._open_core()
        self._detach_iterator()
        if self._finished:
            return
        core.end()
        try:
            while not self._finished:
                self._next_event(timeout, "the job's final statistics after end()")
        except SpdlError as e:
            if e.code != "CANCELLED":  # the daemon just closed the connection: the job is over too
                raise
            self._finished = True

    def close(self) -> None:
        """Disconnects: the daemon ends the job and takes its slots back. Idempotent."""
        self._detach_iterator()
        spec = getattr(self, "_transform", None)  # absent when __init__ failed early
        if spec is not None:
            spec.shutdown()  # the transform threads, if any, are joined
        core, self._core = self._core, None
        if core is not None:
            try:
                core.close()
            except SpdlError:
                self._core = core  # another thread is inside next(): still open
                raise

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- position ----

    def state_dict(self) -> dict:
        """The loader's position, for a checkpoint: where the next batch would come from.

        While an epoch's iterator is unfinished (also after breaking out of it), the position is
        inside that epoch; else it is the start of the epoch the next ``iter()`` yields.
        ``{"epoch", "batch_in_epoch"}`` (0-based), ``batches_seen`` and ``samples_seen`` (yielded so
        far), the job's shape (``rank``, ``world_size``, ``epochs``, ``batch_size``,
        ``batches_per_epoch``, ``dataset_size``) and ``resume_token`` (hex; the daemon's token for a
        mid-epoch position, None at an epoch's start). Plain JSON-able values (torch.save, json).
        """
        cur = self._cursor
        titer = self._titer  # with a transform: the position of what was yielded, not of what was fetched
        if titer is not None and not titer._done:
            epoch, batch = titer.epoch, titer.position
        elif cur is not None and not cur.done and titer is None:
            epoch, batch = cur.epoch, cur.start + cur.yielded
        else:
            epoch, batch = self._epoch, self._start_batch
        # The epoch's last batch was yielded: the next one starts the next epoch. (A stream job has no
        # epochs: batches_per_epoch 0, its one epoch goes on until the stream ends.)
        if len(self) > 0 and batch >= len(self):
            epoch, batch = epoch + 1, 0
        token = None
        if batch > 0:
            if titer is not None and not titer._done:
                token = (titer.last_token or self._open_token).hex()
            else:
                token = (bytes(self._open_core().state) or self._open_token).hex()
        return {
            "version": 2,
            "epoch": epoch,
            "batch_in_epoch": batch,
            "batches_seen": self._batches_seen,
            "samples_seen": self._samples_seen,
            "rank": self.rank,
            "world_size": self.world_size,
            "epochs": self.epochs,
            "batch_size": int(self._info["batch_size"]),
            "batches_per_epoch": int(self._info["batches_per_epoch"]),
            "dataset_size": int(self._info["dataset_size"]),
            "resume_token": token,
        }

    def load_state_dict(self, state: Mapping, timeout: Optional[float] = _DEFAULT) -> None:
        """Continues from a :meth:`state_dict`: the next ``iter(loader)`` yields the saved epoch from
        the saved batch on (exactly the samples after the saved point, in the same order), and the
        ``iter()`` after it the next epoch, as torchdata's StatefulDataLoader does.

        A mid-epoch state reopens the job from its token now (``timeout`` bounds the wait); the
        daemon refuses a token of another job (config, dataset, rank, world size) with a clear error.
        """
        version = int(state.get("version", 0))
        if version not in (1, 2):
            raise ValueError(f"unknown state_dict version {state.get('version')!r}")
        if (int(state["rank"]), int(state["world_size"])) != (self.rank, self.world_size):
            raise ValueError(
                f"the state is for rank {state['rank']}/{state['world_size']}, this loader is rank "
                f"{self.rank}/{self.world_size}"
            )
        epoch, batch = int(state["epoch"]), int(state["batch_in_epoch"])
        token = state.get("resume_token")
        if batch > 0:
            if not token:
                raise ValueError(f"the state is at batch {batch} of epoch {epoch} but has no resume_token")
            self._open((epoch, batch), bytes.fromhex(token), self._resolve_wait(timeout))
        self._detach_iterator()
        self._epoch, self._start_batch = epoch, batch
        self._batches_seen = int(state["batches_seen"])
        self._samples_seen = int(state["samples_seen"])

    # ---- adapters ----

    def as_dataset(self) -> "torch.utils.data.IterableDataset":  # noqa: F821
        """A ``torch.utils.data.IterableDataset`` over this loader, for frameworks that insist on a
        DataLoader: each ``iter()`` yields one epoch of ``{name: torch.Tensor}`` dicts (zero-copy
        views; the slot goes back when they die), ``len()`` is ``len(loader)``, ``set_epoch`` is
        forwarded. Wrap it as ``DataLoader(ds, batch_size=None, num_workers=0)``: the batches are
        batched already, and worker processes cannot share the loader's connection (refused).

        Cost: per batch, one ``torch.from_dlpack`` per tensor and DataLoader's own bookkeeping
        (microseconds); no copy unless ``pin_memory=True`` (which copies every batch into pinned
        memory). Batch metadata (paths, labels list, epoch) is not passed on: iterate the loader
        itself for it.
        """
        return _make_dataset(self)

    # ---- zero-copy checks ----

    def region_address(self) -> int:
        """Address of the job's shared mapping in this process (every tensor lies inside it)."""
        return int(self._open_core().region_address)

    def region_size(self) -> int:
        """Bytes of the job's shared mapping."""
        return int(self._open_core().region_size)

    # ---- helpers ----

    def _open_core(self):
        if self._core is None:
            raise SpdlError("the loader is closed", "FAILED_PRECONDITION")
        return self._core

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("finished" if self._finished else f"next epoch {self._epoch}")
        return f"<spdl_client.Loader job={self._info['job_id']} rank={self.rank}/{self.world_size} {state}>"


def _make_dataset(loader: Loader):
    import torch

    class LoaderDataset(torch.utils.data.IterableDataset):
        """An IterableDataset over a spdl_client.Loader (see Loader.as_dataset)."""

        def __init__(self, loader: Loader) -> None:
            super().__init__()
            self.loader = loader

        def __iter__(self):
            if torch.utils.data.get_worker_info() is not None:
                raise RuntimeError(
                    "spdl_client: a Loader's dataset cannot run in DataLoader worker processes (the daemon "
                    "already works in parallel, and workers cannot share the loader's connection): use "
                    "num_workers=0 and batch_size=None"
                )
            for batch in self.loader:
                views = {name: torch.from_dlpack(t) for name, t in batch.items()}
                batch.release()  # the views alone hold the slot now: it goes back when they die
                del batch
                yield views

        def __len__(self) -> int:
            return len(self.loader)

        def set_epoch(self, epoch: int) -> None:
            self.loader.set_epoch(epoch)

    return LoaderDataset(loader)


# ---- argument resolution ----


def _read_config(config: Any) -> tuple:
    """Returns (yaml_text, name for messages, the parsed config when it was given as a Mapping)."""
    if isinstance(config, Mapping):
        try:
            text = json.dumps(config, indent=2, default=_json_value)  # JSON is YAML
        except (TypeError, ValueError) as e:
            raise TypeError(f"config dict: {e}") from None
        return text, "<dict>", config
    if isinstance(config, os.PathLike):
        path = os.fspath(config)
        return _read_file(path), path, None
    if not isinstance(config, str):
        raise TypeError(f"config must be a path, YAML text (str) or a dict, not {type(config).__name__}")
    if os.path.isfile(config):
        return _read_file(config), config, None
    if "\n" in config or ":" in config:
        return config, "<config>", None
    raise FileNotFoundError(
        f"job config {config!r}: no such file (YAML text is recognized by a newline or a ':')"
    )


def _json_value(value: Any) -> Any:
    """json.dumps' fallback for config values: paths, numpy scalars and arrays, sets."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{value!r} ({type(value).__name__}) is not a config value (str, number, bool, list, dict, path)")


def _read_file(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _resolve_socket(socket: Optional[str]) -> str:
    if socket is not None:
        return os.fspath(socket)
    return os.environ.get("SPDLD_SOCKET") or DEFAULT_SOCKET


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _resolve_rank(rank: Optional[int], world_size: Optional[int]) -> tuple:
    r = _env_int("RANK", 0) if rank is None else int(rank)
    w = _env_int("WORLD_SIZE", 1) if world_size is None else int(world_size)
    if w < 1:
        raise ValueError(f"world_size must be at least 1, not {w}")
    if not 0 <= r < w:
        raise ValueError(f"rank {r} is not in [0, world_size={w})")
    return r, w


def _resolve_epochs(epochs: Optional[int]) -> Optional[int]:
    if epochs is None:
        return None
    e = int(epochs)
    if e < 0:
        raise ValueError(f"epochs must be None (as many as iterated) or >= 1, not {e}")
    return e or None  # 0: the daemon's "until ended", the same as None


def _resolve_workers(threads: int, workers: Optional[int], executor: Any) -> int:
    """The transform's worker count: ``transform_workers``, else ``transform_threads`` (its older
    name, for the thread executor)."""
    if workers is None:
        return int(threads)
    if int(threads) not in (0, int(workers)):
        raise ValueError(f"transform_threads={threads} and transform_workers={workers}: give one of them")
    return int(workers)


def _resolve_timeout(timeout: Optional[float]) -> Optional[float]:
    if timeout is None:
        return None
    t = float(timeout)
    if not t >= 0:
        raise ValueError(f"timeout must be None (no limit) or a number of seconds >= 0, not {timeout!r}")
    return t


def _normalize_device(device: Any) -> str:
    if isinstance(device, bool):
        raise TypeError(f"device must be 'cpu', 'cuda', 'cuda:N', N or a torch.device, not {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device {device}: a CUDA ordinal is >= 0")
        return f"cuda:{device}"
    text = str(device)  # also torch.device
    if text == "cpu" or text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise ValueError(f"device {device!r}: expected 'cpu', 'cuda', 'cuda:N', N or a torch.device")


def _config_device(yaml_text: str, parsed: Optional[Mapping]) -> Optional[str]:
    """The config's output.device, or None when it has none (or cannot be read here)."""
    if parsed is None:
        try:
            import yaml
        except ImportError:
            warnings.warn("spdl_client: PyYAML is not installed, so LOCAL_RANK cannot pick the GPU of a cuda job; "
                          "pass device= (pip install PyYAML)", RuntimeWarning, stacklevel=4)
            return None
        try:
            parsed = yaml.safe_load(yaml_text)
        except yaml.YAMLError:
            return None  # the daemon reports the error, with its line
    output = parsed.get("output") if isinstance(parsed, Mapping) else None
    device = output.get("device") if isinstance(output, Mapping) else None
    return None if device is None else str(device)


def _resolve_device(device: Any, overrides: list, yaml_text: str, parsed: Optional[Mapping]) -> Optional[str]:
    """The output.device override to send, or None: `device` when given; else, under torchrun
    (LOCAL_RANK), cuda:LOCAL_RANK for a job whose config asks for a GPU."""
    if device is not None:
        return _normalize_device(device)
    if any(key == "output.device" for key, _ in overrides):
        return None
    local_rank = _env_int("LOCAL_RANK", -1)
    if local_rank < 0:
        return None
    configured = _config_device(yaml_text, parsed)
    if configured is None or not configured.startswith("cuda"):
        return None
    return f"cuda:{local_rank}"


def _trainer_device_uuid(overrides: list, yaml_text: str, parsed: Optional[Mapping]) -> bytes:
    """The UUID (16 bytes) of this process's GPU the job delivers to, sent with the job so that spdld
    finds that GPU whatever CUDA_VISIBLE_DEVICES numbers it there; b"" for a CPU job or when it cannot
    be read (then spdld takes cuda:N as its own ordinal and the client checks the GPU is this one).
    For a bare "cuda", the current torch device (the override is made cuda:N to match)."""
    device = None
    for key, value in overrides:
        if key == "output.device":
            device = str(value)
    if device is None:
        if parsed is None:
            try:
                import yaml
            except ImportError:
                return b""  # YAML text without PyYAML: the client checks the daemon's GPU instead
        device = _config_device(yaml_text, parsed)
    if device is None or not device.startswith("cuda"):
        return b""
    torch = sys.modules.get("torch")
    # Only a module built with the test hooks has `_gpu_simulated`: its GPU jobs may then run on a
    # device made of files, which torch's CUDA knows nothing of.
    simulated = getattr(_native, "_gpu_simulated", None)
    torch_cuda = torch is not None and not (simulated is not None and simulated())
    try:
        torch_cuda = torch_cuda and torch.cuda.is_available()
    except Exception:
        torch_cuda = False
    if device == "cuda":
        ordinal = torch.cuda.current_device() if torch_cuda else 0
        overrides.append(("output.device", f"cuda:{ordinal}"))
    else:
        try:
            ordinal = int(device[5:])
        except ValueError:
            return b""  # the daemon reports the bad device
    if torch_cuda:
        try:
            uuid = torch.cuda.get_device_properties(ordinal).uuid
            raw = getattr(uuid, "bytes", None)
            if isinstance(raw, (bytes, bytearray)) and len(raw) == 16:
                return bytes(raw)
        except Exception:
            pass  # the CUDA runtime below says why, if it fails too
    try:
        return bytes(_native.cuda_device_uuid(ordinal))
    except (SpdlError, AttributeError):
        return b""


def _sampler_seed(yaml_text: str, parsed: Optional[Mapping], overrides: list) -> Optional[int]:
    """The job's sampler.seed as the daemon will see it (the config, then the overrides; default 0),
    for Batch.seed; None when the config cannot be read here (YAML text without PyYAML)."""
    seed: Any = 0
    if parsed is None:
        try:
            import yaml
        except ImportError:
            parsed = None
            seed = None
        else:
            try:
                parsed = yaml.safe_load(yaml_text)
            except yaml.YAMLError:
                parsed = None  # the daemon reports the error, with its line
    sampler = parsed.get("sampler") if isinstance(parsed, Mapping) else None
    if isinstance(sampler, Mapping) and sampler.get("seed") is not None:
        seed = sampler["seed"]
    for key, value in overrides:
        if key == "sampler.seed":
            seed = value
    try:
        return None if seed is None else int(seed) & ((1 << 64) - 1)
    except (TypeError, ValueError):
        return None  # the daemon refuses it


def _yaml_value(value: Any) -> str:
    """A Python value as the YAML text of an override."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return json.dumps(value)  # lists and dicts: JSON is YAML flow syntax


def _resolve_overrides(overrides: OverridesLike) -> list:
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        items = list(overrides.items())
    elif isinstance(overrides, str):
        raise TypeError('overrides must be a dict or a list of "key=value" strings, not one string')
    else:
        items = []
        for o in overrides:
            if isinstance(o, str):
                key, sep, value = o.partition("=")
                if not sep:
                    raise ValueError(f'override {o!r} is not of the form "key.path=value"')
                items.append((key, value))
            elif isinstance(o, tuple) and len(o) == 2:
                items.append(o)
            else:
                raise TypeError(f'override {o!r}: expected "key.path=value" or a (key, value) pair')
    out = []
    for key, value in items:
        key = str(key).strip()
        if not key:
            raise ValueError("override with an empty key")
        out.append((key, _yaml_value(value)))
    return out
