"""The exceptions of the package, in one hierarchy under RunloopError.

A loop's own ending is never an exception: it is the stream's ``outcome``.
These are for what keeps a caller from getting a loop at all.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConnectError",
    "ConnectTimeout",
    "RunEnded",
    "RunNotServed",
    "RunRefused",
    "RunloopError",
    "Timeout",
    "UsedAfterFork",
]


class RunloopError(Exception):
    """Base of every exception the package raises."""


class ConnectError(RunloopError):
    """The server could not be reached, TLS failed, or the credential was refused.

    A refused credential shows at the first ``start``: the protocol answers a
    refusal with a closed connection and no frame, so nothing tells it from a
    connection that works until something is asked of it.
    """


class Timeout(RunloopError, TimeoutError):
    """A wait the caller bounded ran out; also a builtin ``TimeoutError``."""


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
