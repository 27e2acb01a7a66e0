"""Producer: put samples into a named, node-local spdld stream (issue 21).

::

    import spdl_client

    with spdl_client.Producer("clicks", max_samples=10000) as p:   # defines the stream if new
        off = p.put(jpeg_bytes, label=3, metadata=b'{"user": 7}')  # -> the sample's stream offset
        p.put_file("/data/new/cat.jpg", label=0)
    # leaving the block closes the producer; close(end_stream=True) also ends the stream, so the
    # jobs reading it (source.type: stream) drain what is left and finish.

A stream is defined by its first producer or stream job: its bounds (``max_samples``,
``max_bytes``: the retained log, not yet consumed by every consumer group) and who else may use it
(``allowed_uids``; the defining uid and root always may). A full stream blocks ``put`` until the
consumers catch up, or with ``block=False`` raises :class:`SpdlError` with code
``"RESOURCE_EXHAUSTED"``: nothing is dropped. Sample bytes larger than 4 KiB go through a shared
buffer the daemon maps (``buffer_bytes``, the largest sample: default 16 MiB), not the socket.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from . import _spdl_client as _native
from ._errors import SpdlError

__all__ = ["Producer"]


class Producer:
    """A producer of stream ``name`` on the daemon at ``socket`` (``$SPDLD_SOCKET`` or
    ``/run/spdld/spdld.sock``). Thread-safe (calls are serialized)."""

    def __init__(self, name: str, socket: Optional[str] = None, *, max_samples: int = 0, max_bytes: int = 0,
                 allowed_uids: Sequence[int] = (), buffer_bytes: int = 0, client_name: str = "") -> None:
        socket = socket or os.environ.get("SPDLD_SOCKET", "/run/spdld/spdld.sock")
        self._core = _native.ProducerCore.open(socket, name, max_samples, max_bytes, list(allowed_uids), buffer_bytes,
                                               client_name or f"spdl_client.Producer pid={os.getpid()}")
        self._name = name
        self._closed = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def info(self) -> dict:
        """The stream as the daemon says: ``stream``, ``owner_uid``, ``max_samples``, ``max_bytes``,
        ``buffer_bytes``."""
        return self._core.info

    def put(self, data, label: int = -1, metadata: bytes = b"", *, block: bool = True, key: str = "") -> int:
        """Puts one sample (``bytes`` or any C-contiguous buffer: encoded media bytes) and returns its
        stream offset once the daemon holds it. ``label`` goes to the batch's ``label`` tensor,
        ``metadata`` with the batch (``BatchReady.metadata``), ``key`` names it in logs and paths."""
        if self._closed:
            raise SpdlError(f"the producer of stream '{self._name}' is closed", "FAILED_PRECONDITION")
        return self._core.put(data, int(label), bytes(metadata), bool(block), str(key))

    def put_many(self, data: Sequence, labels: Optional[Sequence[int]] = None,
                 metadata: Optional[Sequence[bytes]] = None, *, block: bool = True,
                 keys: Optional[Sequence[str]] = None) -> list:
        """Puts several samples in order and returns their offsets once the daemon holds every one.
        Up to 128 puts are in flight at once (not one round trip each), so small samples are not
        bound by the round trip. ``labels`` / ``metadata`` / ``keys``, when given, have one entry per
        sample. On the first failed put no more are sent; the ``SpdlError`` names the item and how
        many of the items were put (the items put keep their places in the stream)."""
        if self._closed:
            raise SpdlError(f"the producer of stream '{self._name}' is closed", "FAILED_PRECONDITION")
        data = list(data)
        n = len(data)
        for what, seq in (("labels", labels), ("metadata", metadata), ("keys", keys)):
            if seq is not None and len(seq) != n:
                raise SpdlError(f"put_many: {len(seq)} {what} for {n} samples", "INVALID_ARGUMENT")
        return self._core.put_many(data, [int(x) for x in labels] if labels is not None else [],
                                   [bytes(m) for m in metadata] if metadata is not None else [],
                                   [str(k) for k in keys] if keys is not None else [], bool(block))

    def put_file(self, path: str, label: int = -1, metadata: bytes = b"", *, block: bool = True) -> int:
        """Puts a file's bytes (read here, with this process's rights), keyed by its path."""
        with open(path, "rb") as f:
            data = f.read()
        return self.put(data, label, metadata, block=block, key=str(path))

    def flush(self) -> None:
        """Every put has returned once the daemon held its sample: nothing waits on this side."""
        if self._closed:
            return

    def close(self, end_stream: bool = False) -> None:
        """Stops producing; with ``end_stream`` the stream is closed too (its jobs finish once drained)."""
        if self._closed:
            return
        self._closed = True
        self._core.close(bool(end_stream))

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Producer({self._name!r}{', closed' if self._closed else ''})"
