"""The blocking twin of the async API, for scripts and notebooks.

Each blocking call releases the GIL and waits in slices of a few tens of
milliseconds, running Python's signal handlers between them: Ctrl-C
interrupts any wait well within 100 ms. Every wait is bounded by the
client's ``timeout`` (300 s by default) or the call's own, so a server
that falls silent raises Timeout instead of hanging the caller. An
interrupted or timed-out loop stops its run, as a cancelled one does in
the async API.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Iterator, Mapping, Optional, Sequence, Type, Union

from . import _native
from ._client import loop_args
from ._errors import NotEnded, RunEnded
from ._native import Chunk, Error, Outcome
from ._request import (
    CLIENT_DEFAULT,
    DEFAULT_TIMEOUT,
    DEFAULT_TRANSCRIPT_LIMIT,
    PathLike,
    Size,
    Wait,
    authorities,
    seconds,
    start_args,
)

Event = Union[Chunk, Error]


class SyncStream:
    """One loop: an iterator of ``Chunk`` and ``Error``, in order; a context
    manager whose early exit stops the run."""

    __slots__ = ("_run", "_native", "_batch", "_at", "_outcome", "_timeout")

    def __init__(self, run: SyncRun, native: _native.Loop, timeout: Optional[float]) -> None:
        self._run = run
        self._native = native
        self._batch: list[Event] = []
        self._at = 0
        self._outcome: Optional[Outcome] = None
        self._timeout = timeout

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        at = self._at
        batch = self._batch
        if at < len(batch):
            self._at = at + 1
            return batch[at]
        if self._outcome is not None:
            raise StopIteration
        native = self._native
        try:
            # What is there already, without releasing the GIL; else a wait.
            taken = native.take()
            if taken is not None and not taken:
                taken = native.next_batch_blocking(self._timeout)
        except BaseException:
            self._run._abandon()
            raise
        if taken is None:
            self._outcome = native.outcome()
            raise StopIteration
        self._batch = taken
        self._at = 1
        return taken[0]

    @property
    def outcome(self) -> Outcome:
        """How the loop ended, once the stream has been read to its end.

        Raises NotEnded before that (``ended`` says whether it has).
        """
        outcome = self._outcome
        if outcome is None:
            raise NotEnded("the loop has not ended: read the stream to its end first")
        return outcome

    @property
    def ended(self) -> bool:
        """Whether the stream has been read to its end."""
        return self._outcome is not None

    def transcript(self) -> list[Chunk]:
        """The loop coalesced so far (protocol §11), as chunks (see ``Stream.transcript``)."""
        return self._native.transcript()

    def __enter__(self) -> SyncStream:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._outcome is None:
            self._run._abandon()


class SyncRun:
    """A run, blocking; stopped on leaving ``with``."""

    __slots__ = ("_native", "_abandoned", "_timeout")

    def __init__(self, native: _native.Run, timeout: Optional[float]) -> None:
        self._native = native
        self._abandoned = False
        self._timeout = timeout

    @property
    def id(self) -> str:
        """The run's id, as the server minted it."""
        return self._native.id

    @property
    def ended(self) -> bool:
        """Whether the run has ended, or has been stopped by this side."""
        return self._abandoned or self._native.is_ended()

    def loop(
        self,
        prompt: str,
        *,
        transcript: bool = True,
        transcript_limit: Size = DEFAULT_TRANSCRIPT_LIMIT,
        timeout: Wait = CLIENT_DEFAULT,
    ) -> SyncStream:
        """Asks for one loop with ``prompt``; raises RunEnded if the run is over
        (see ``Run.loop``)."""
        if self.ended:
            raise RunEnded(f"run {self.id} has ended: start a new run for another loop")
        native = self._native.open_loop(prompt, loop_args(transcript, transcript_limit))
        return SyncStream(self, native, seconds(timeout, self._timeout))

    def stop(self, *, timeout: Wait = CLIENT_DEFAULT) -> None:
        """Stops the run and waits until the server says it has ended."""
        self._abandoned = True
        self._native.stop_blocking(seconds(timeout, self._timeout))

    def wait_ended(self, *, timeout: Wait = CLIENT_DEFAULT) -> None:
        """Waits until the run has ended on the server."""
        self._native.wait_ended_blocking(seconds(timeout, self._timeout))

    def _abandon(self) -> None:
        self._abandoned = True
        self._native.stop_nowait()

    def __enter__(self) -> SyncRun:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if exc_type is None:
            self.stop()
        else:
            self._abandon()

    def __repr__(self) -> str:
        return f"SyncRun(id={self.id!r}, ended={self.ended})"


class SyncClient:
    """A connection to a provider server, blocking; closed on leaving ``with``."""

    __slots__ = ("_native", "_timeout")

    def __init__(self, native: _native.Client, timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        self._native = native
        self._timeout = timeout

    def start(
        self,
        name: Optional[str] = None,
        *,
        image: Optional[Mapping[str, Any]] = None,
        digest: Optional[str] = None,
        memory: Size = "1G",
        disk: Size = 0,
        agent: Any = None,
        timeout: Wait = CLIENT_DEFAULT,
    ) -> SyncRun:
        """Opens a run and waits for its id (see ``Client.start``)."""
        args = start_args(name, image, digest, memory, disk, agent)
        limit = seconds(timeout, self._timeout)
        return SyncRun(self._native.start_blocking(args, limit), self._timeout)

    def close(self) -> None:
        """Closes the connection and waits for the close handshake (2 s at most)."""
        self._native.close_blocking()

    @property
    def closed(self) -> bool:
        """Whether the connection is over."""
        return self._native.is_closed()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()


def connect_sync(
    url: str,
    token: str = "",
    *,
    ca: Union[None, PathLike, Sequence[PathLike]] = None,
    connect_timeout: Optional[float] = 10.0,
    timeout: Optional[float] = DEFAULT_TIMEOUT,
) -> SyncClient:
    """Connects, blocking (see ``connect``): every later wait is bounded by
    ``timeout`` (300 s by default; None: no bound) unless a call gives its own."""
    native = _native.connect_blocking(url, token, authorities(ca), connect_timeout)
    return SyncClient(native, timeout)
