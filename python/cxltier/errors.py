"""Exceptions: every failure the daemon or the library reports is a cxltier.Error.

Each carries the wire protocol's error code (``code``, an int; ``name``, e.g.
``"bad-payload"``) and the message as the C++ client gives it (the daemon's
own message, prefixed by the code's name: ``"limit: too many pools"``).
A subclass per code lets a caller catch exactly what it can handle.
An error of ``Client.report`` also has ``accepted`` and ``rejected``: what the
parts sent before the failure took (do not send those again); its message
starts with them.
"""

from __future__ import annotations


class Error(Exception):
    """A failed cxltier call: ``code`` and ``name`` of the error, and its ``message``."""

    code: int = 0
    name: str = ""

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.name = name
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code}, name={self.name!r}, message={self.message!r})"


class BadFrameError(Error):
    """1 bad-frame: the daemon sent (or got) bytes that are no frame."""


class BadVersionError(Error):
    """2 bad-version: a protocol version not spoken here."""


class UnknownTypeError(Error):
    """3 unknown-type: a message type the daemon does not know."""


class TooLargeError(Error):
    """4 too-large: a message over the daemon's limit."""


class BadPayloadError(Error):
    """5 bad-payload: a message that does not match its layout (a bad hint kind, group 0)."""


class NotReadyError(Error):
    """6 not-ready: hello (or a pool) first; or the client is closed."""


class BadPoolError(Error):
    """7 bad-pool: a pool the daemon refused (fd, size, stride, range)."""


class LimitError(Error):
    """8 limit: a configured limit was reached (the message names it)."""


class BadSlotError(Error):
    """9 bad-slot: a slot or block index out of range."""


class DeniedError(Error):
    """10 denied: not allowed for this peer (another client holds the key, no privilege)."""


class InternalError(Error):
    """11 internal: the daemon failed, or a system call did (connect, mmap); may be retried."""


class GeometryError(Error):
    """12 geometry: the model's geometry is invalid or not the daemon's block size."""


class NoLeaseError(Error):
    """13 no-lease: copy mode: a block with no place, or a lease not held."""


class BusyError(Error):
    """14 busy: copy mode: the write lease is held, or every reader row is in use."""


_BY_CODE = {
    1: BadFrameError,
    2: BadVersionError,
    3: UnknownTypeError,
    4: TooLargeError,
    5: BadPayloadError,
    6: NotReadyError,
    7: BadPoolError,
    8: LimitError,
    9: BadSlotError,
    10: DeniedError,
    11: InternalError,
    12: GeometryError,
    13: NoLeaseError,
    14: BusyError,
}


def _make_error(code: int, name: str, message: str) -> Error:
    """The exception object for a failed Status (called by the extension)."""
    return _BY_CODE.get(code, Error)(code, name, message)


__all__ = ["Error"] + [c.__name__ for c in _BY_CODE.values()]
