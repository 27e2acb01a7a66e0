"""Loader and Batch: the Python API over the C++ client library (see the package docstring)."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Optional, Union

from . import _spdl_client as _native
from ._errors import SpdlError

__all__ = ["Loader", "Batch", "Tensor", "DEFAULT_SOCKET"]

Tensor = _native.Tensor

#: Where the packaged daemon listens (systemd/spdld.service); $SPDLD_SOCKET overrides it.
DEFAULT_SOCKET = "/run/spdld/spdld.sock"

ConfigLike = Union[str, "os.PathLike[str]"]
OverridesLike = Union[Mapping[str, Any], Iterable[Union[str, tuple]], None]


class Batch(Mapping):
    """One batch: a read-only mapping of tensor name to :class:`Tensor` (``"image"``, ``"label"``).

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
    label, as a list; the same values as the ``"label"`` tensor).
    """

    __slots__ = ("_tensors", "epoch", "batch_in_epoch", "seq", "rows", "slot", "paths", "labels", "_released")

    def __init__(self, tensors: list, meta: dict) -> None:
        self._tensors = {t.name: t for t in tensors}
        self.epoch: int = meta["epoch"]
        self.batch_in_epoch: int = meta["batch_in_epoch"]
        self.seq: int = meta["seq"]
        self.rows: int = meta["rows"]
        self.slot: int = meta["slot"]
        self.paths: list[str] = meta["paths"]
        self.labels: list[int] = meta["labels"]
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


class Loader:
    """One job on the node's spdld daemon; iterate it to receive the job's batches.

    ``Loader(config, *, socket=None, rank=None, world_size=None, overrides=None, epochs=None)``

    - ``config``: the job config: a path (str or PathLike) to a YAML file, or the YAML text itself
      (a str that is not an existing file and contains a newline or ':').
    - ``socket``: the daemon's control socket; default ``$SPDLD_SOCKET``, else
      ``/run/spdld/spdld.sock``.
    - ``rank`` / ``world_size``: this trainer's place among the job's ranks; default the
      ``RANK`` / ``WORLD_SIZE`` environment variables that torchrun sets, else 0 / 1.
    - ``overrides``: config values to change before validation, as a dict
      ``{"source.root": "/data", "batch.size": 64}`` or a list of ``"key.path=value"`` strings
      (values are YAML, as with ``spdl-client --set``).
    - ``epochs``: how many epochs the job runs (None: 1; 0: until closed).

    Iterating yields one :class:`Batch` per step, across all epochs, and stops when the job is done
    (the daemon sends its final statistics). The end of each epoch is recorded in
    :attr:`epoch_summaries` (nothing is yielded for it). Errors raise :class:`SpdlError` with the
    daemon's message. While waiting for a batch the GIL is released.

    ``len(loader)`` is the number of batches per epoch for this rank (the same on every rank); the
    whole job yields ``len(loader) * epochs`` batches.

    Threads: use a Loader from one thread at a time (calls from several threads are serialized;
    :meth:`close` refuses while another thread waits in ``next()``). Batches and their views may be
    dropped on any thread. A Batch may outlive its Loader (its memory stays mapped), but once the
    loader is closed the daemon may reuse the memory: copy what you need first.

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
        overrides: OverridesLike = None,
        epochs: Optional[int] = None,
        client_name: Optional[str] = None,
    ) -> None:
        self._core = None  # first, so that close() works even if the rest fails
        yaml_text, config_name = _read_config(config)
        self.socket: str = _resolve_socket(socket)
        self.rank, self.world_size = _resolve_rank(rank, world_size)
        self.epochs: int = _resolve_epochs(epochs)
        self.overrides: list = _resolve_overrides(overrides)
        self.config_name: str = config_name
        if client_name is None:
            client_name = f"spdl_client (python) pid={os.getpid()} rank={self.rank}/{self.world_size}"
        self._yaml_text = yaml_text
        self._client_name = client_name
        self._core = _native.Core.open(
            self.socket, yaml_text, config_name, self.overrides, self.rank, self.world_size, self.epochs, client_name
        )
        self._info: dict = self._core.info
        self._device: str = self._core.device
        self._finished = False
        self._job_stats: Optional[dict] = None
        self.epoch_summaries: list[dict] = []
        self._batches_seen = 0
        self._samples_seen = 0
        # Position of the next batch: (epoch, batch_in_epoch).
        self._next_epoch = 0
        self._next_batch_in_epoch = 0

    # ---- iteration ----

    def __iter__(self) -> "Loader":
        return self

    def __next__(self) -> Batch:
        if self._finished:
            raise StopIteration
        core = self._open_core()
        if core.held >= self._info["num_slots"] and not self._all_batches_seen():
            warnings.warn(
                f"spdl_client: all {self._info['num_slots']} slots of the job (prefetch) are held by live "
                "batches or views of them: next() waits until one is dropped or released (from another "
                "thread), or for ever. Keep at most prefetch - 1 batches alive (e.g. not list(loader)).",
                RuntimeWarning,
                stacklevel=2,
            )
        while True:
            kind, a, b = core.next()
            if kind == "batch":
                batch = Batch(a, b)
                self._advance(batch)
                return batch
            if kind == "epoch_end":
                self.epoch_summaries.append(a)
                continue
            a["epochs"] = list(self.epoch_summaries)
            self._job_stats = a
            self._finished = True
            if not a.get("samples"):
                # A job that ended without delivering anything did not do its work.
                raise SpdlError(
                    f"the job ended without delivering a single sample ({a.get('skipped', 0)} skipped)", "DATA_LOSS"
                )
            raise StopIteration

    def next(self) -> Optional[Batch]:
        """The next batch, or None when the job is done."""
        return next(self, None)

    def __len__(self) -> int:
        return int(self._info["batches_per_epoch"])

    def _all_batches_seen(self) -> bool:
        return self.epochs > 0 and self._batches_seen >= len(self) * self.epochs

    def _advance(self, batch: Batch) -> None:
        self._batches_seen += 1
        self._samples_seen += batch.rows
        self._next_epoch = batch.epoch
        self._next_batch_in_epoch = batch.batch_in_epoch + 1
        if self._next_batch_in_epoch >= len(self):
            self._next_epoch += 1
            self._next_batch_in_epoch = 0

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
        ``num_slots`` (prefetch depth) and ``layout`` (per tensor: name, dtype, full-batch shape,
        bytes); plus ``rank``, ``world_size``, ``epochs`` and ``socket`` as opened."""
        d = dict(self._info)
        d["layout"] = [dict(t) for t in self._info["layout"]]
        d.update(rank=self.rank, world_size=self.world_size, epochs=self.epochs, socket=self.socket)
        return d

    @property
    def finished(self) -> bool:
        """Whether the job is done (iteration has stopped and :meth:`stats` are the daemon's)."""
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
        ``kind`` ("io" or "cpu"), ``tasks``, ``failures``, ``busy_seconds``, task time ``avg_ms``,
        ``p50_ms``, ``p90_ms``, ``p99_ms``, ``put_wait_seconds``, ``get_wait_seconds``,
        ``items_per_s``), ``cache`` (the node's sample cache: ``hits`` and ``misses`` of this job,
        node-wide ``evictions``, ``bytes``, ``budget_bytes``; all 0 without a cache) — plus
        ``epochs`` (the per-epoch summaries) and ``finished: True``.

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

    def end(self) -> None:
        """Asks the daemon to stop the job early; keep iterating to drain it (iteration then
        stops with the daemon's stats, or raises SpdlError CANCELLED if it just disconnects)."""
        self._open_core().end()

    def close(self) -> None:
        """Disconnects: the daemon ends the job and takes its slots back. Idempotent."""
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
        """The loader's position: where the next batch would start, and how to continue from there.

        ``{"epoch", "batch_in_epoch"}`` (0-based, of the next batch), ``batches_seen`` and
        ``samples_seen`` (yielded so far), the job's shape (``rank``, ``world_size``, ``epochs``,
        ``batch_size``, ``batches_per_epoch``, ``dataset_size``) and ``resume_token``: the daemon's
        token for "right after the last batch yielded" (hex, None before the first batch). Plain
        JSON-able values, so it can be saved with a checkpoint (torch.save, json).
        """
        token = bytes(self._open_core().state)
        return {
            "version": 1,
            "epoch": self._next_epoch,
            "batch_in_epoch": self._next_batch_in_epoch,
            "batches_seen": self._batches_seen,
            "samples_seen": self._samples_seen,
            "rank": self.rank,
            "world_size": self.world_size,
            "epochs": self.epochs,
            "batch_size": int(self._info["batch_size"]),
            "batches_per_epoch": int(self._info["batches_per_epoch"]),
            "dataset_size": int(self._info["dataset_size"]),
            "resume_token": token.hex() if token else None,
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Continues from a :meth:`state_dict`: the job is reopened on the daemon so that iteration
        yields exactly the samples after the saved point, in the same order, then the later epochs.

        Call it before iterating (batches already prefetched by this loader are dropped). The state
        must come from the same job (config, dataset, rank, world size): the daemon refuses a token
        of another job with a clear error. A state saved before the first batch starts from the top.
        """
        if int(state.get("version", 0)) != 1:
            raise ValueError(f"unknown state_dict version {state.get('version')!r}")
        if (int(state["rank"]), int(state["world_size"])) != (self.rank, self.world_size):
            raise ValueError(
                f"the state is for rank {state['rank']}/{state['world_size']}, this loader is rank "
                f"{self.rank}/{self.world_size}"
            )
        token = state.get("resume_token")
        if not token:
            return  # saved before the first batch: this loader already starts there
        old = self._open_core()
        self._core = None
        old.close()
        self._core = _native.Core.open(
            self.socket, self._yaml_text, self.config_name, self.overrides, self.rank, self.world_size,
            self.epochs, self._client_name, bytes.fromhex(token),
        )
        self._info = self._core.info
        self._finished = False
        self._job_stats = None
        self.epoch_summaries = []
        self._batches_seen = int(state["batches_seen"])
        self._samples_seen = int(state["samples_seen"])
        self._next_epoch = int(state["epoch"])
        self._next_batch_in_epoch = int(state["batch_in_epoch"])

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
        state = "closed" if self.closed else ("finished" if self._finished else "open")
        return f"<spdl_client.Loader job={self._info['job_id']} rank={self.rank}/{self.world_size} {state}>"


# ---- argument resolution ----


def _read_config(config: ConfigLike) -> tuple:
    """Returns (yaml_text, name for messages)."""
    if isinstance(config, os.PathLike):
        path = os.fspath(config)
        return _read_file(path), path
    if not isinstance(config, str):
        raise TypeError(f"config must be a path or YAML text (str), not {type(config).__name__}")
    if os.path.isfile(config):
        return _read_file(config), config
    if "\n" in config or ":" in config:
        return config, "<config>"
    raise FileNotFoundError(
        f"job config {config!r}: no such file (YAML text is recognized by a newline or a ':')"
    )


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


def _resolve_epochs(epochs: Optional[int]) -> int:
    if epochs is None:
        return 1
    e = int(epochs)
    if e < 0:
        raise ValueError(f"epochs must be >= 0 (0 = endless), not {e}")
    return e


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
