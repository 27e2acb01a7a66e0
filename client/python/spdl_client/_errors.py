"""SpdlError: how spdl_client reports what the daemon (or the client library) refused."""

from __future__ import annotations

__all__ = ["SpdlError", "SpdlTimeoutError"]


class SpdlError(RuntimeError):
    """An error from spdld or the client library, with the daemon's message.

    ``str(err)`` is the full message: for a bad job config, a summary line then every problem,
    one per line, as ``NAME:LINE:COL: PATH: MESSAGE``. ``err.code`` names the kind of failure:

    - ``"INVALID_ARGUMENT"``: a bad config, override, rank or world size;
    - ``"UNAVAILABLE"``: no daemon at the socket, or it went away (also a daemon shutting down);
    - ``"PERMISSION_DENIED"``: e.g. ``source.root`` outside the daemon's allowed roots, or the
      socket is not ours to use;
    - ``"NOT_FOUND"``, ``"RESOURCE_EXHAUSTED"`` (over the daemon's memory budget or quotas);
    - ``"DATA_LOSS"``: the job failed on the daemon (``on_error: fail`` and a bad sample);
    - ``"FAILED_PRECONDITION"``: a protocol version mismatch, a closed loader, a released batch;
    - ``"DEADLINE_EXCEEDED"``: a wait ran past its ``timeout`` (:class:`SpdlTimeoutError`);
    - ``"CANCELLED"``, ``"INTERNAL"`` (a protocol error: a bug).
    """

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __reduce__(self):  # picklable (e.g. across multiprocessing)
        return (type(self), (self.message, self.code))


class SpdlTimeoutError(SpdlError, TimeoutError):
    """A wait for spdld ran past its timeout (``code`` ``"DEADLINE_EXCEEDED"``); also a
    :class:`TimeoutError`. The message names the job and what was awaited. Nothing was lost: the
    loader stays usable, and the same call again keeps waiting."""

    def __init__(self, message: str, code: str = "DEADLINE_EXCEEDED") -> None:
        super().__init__(message, code)


SpdlError.__module__ = "spdl_client"  # how tracebacks name it (and where pickle finds it)
SpdlTimeoutError.__module__ = "spdl_client"
