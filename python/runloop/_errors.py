"""The exceptions of the package, in one hierarchy under RunloopError.

A loop's own ending is never an exception: it is the stream's ``outcome``.
These are for what keeps a caller from getting a loop at all.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConnectError",
    "ConnectTimeout",
    "ConnectionLost",
    "NotEnded",
    "RunEnded",
    "RunNotServed",
    "RunRefused",
    "RunloopError",
    "Timeout",
    "TranscriptTooLarge",
    "UsedAfterFork",
]


class RunloopError(Exception):
    """Base of every exception the package raises."""


class ConnectError(RunloopError):
    """The server could not be reached, TLS failed, or it turned the connection away.

    A refused credential shows at the first ``start``: the protocol answers a
    refusal with a closed connection and no frame, so nothing tells it from a
    connection that works until something is asked of it. A server that
    closes the connection and says why (it is full, it is draining) is one too.
    """


class ConnectionLost(RunloopError):
    """The connection ended before the server answered, and not by a refusal.

    The message names how: it broke with no close handshake (the server
    stopped, or something on the way cut it), the server sent a message over
    this client's limit or what is not a WebSocket message, or it closed the
    connection without a word.
    """


class Timeout(RunloopError, TimeoutError):
    """A wait ran past its bound (``timeout=``); also a builtin ``TimeoutError``.

    A loop whose wait for its next event times out has its run stopped, as an
    interrupted one does.
    """


class ConnectTimeout(ConnectError, Timeout):
    """Connecting (TCP, TLS, WebSocket upgrade, authorization) took too long."""


class RunRefused(RunloopError):
    """The server refused the run; ``error`` is its JSON error value."""

    error: Any

    def __init__(self, message: str, error: Any = None) -> None:
        super().__init__(message)
        self.error = error


class RunNotServed(RunloopError):
    """The server answered the run with a bare finish: received, not served."""


class RunEnded(RunloopError):
    """A loop was asked of a run that has ended (stopped, or its container ended)."""


class UsedAfterFork(RunloopError):
    """A connection made before ``os.fork()`` was used in the child."""


class NotEnded(RunloopError):
    """A stream's ``outcome`` was read before the stream was read to its end."""


class TranscriptTooLarge(RunloopError):
    """A loop's transcript passed its bound (``transcript_limit``) and was let go.

    The loop itself went on, and its stream and outcome are whole; only the
    coalesced copy is gone. ``limit`` is the bound, in bytes of chunk JSON.
    """

    limit: int

    def __init__(self, message: str, limit: int = 0) -> None:
        super().__init__(message)
        self.limit = limit
