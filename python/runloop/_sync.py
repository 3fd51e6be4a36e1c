"""The blocking twin of the async API, for scripts and notebooks.

Each blocking call releases the GIL and waits in slices of a few tens of
milliseconds, running Python's signal handlers between them: Ctrl-C
interrupts any wait well within 100 ms. An interrupted loop stops its run,
as a cancelled one does in the async API.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Iterator, Mapping, Optional, Sequence, Type, Union

from . import _native
from ._errors import RunEnded
from ._native import Chunk, Error, Outcome
from ._request import PathLike, Size, authorities, start_args

Event = Union[Chunk, Error]


class SyncStream:
    """One loop: an iterator of ``Chunk`` and ``Error``, in order; a context
    manager whose early exit stops the run."""

    __slots__ = ("_run", "_native", "_batch", "_at", "_outcome")

    def __init__(self, run: SyncRun, native: _native.Loop) -> None:
        self._run = run
        self._native = native
        self._batch: list[Event] = []
        self._at = 0
        self._outcome: Optional[Outcome] = None

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
        try:
            batch = self._native.next_batch_blocking()
        except BaseException:
            self._run._abandon()
            raise
        if not batch:
            self._outcome = self._native.outcome()
            raise StopIteration
        self._batch = batch
        self._at = 1
        return batch[0]

    @property
    def outcome(self) -> Optional[Outcome]:
        """How the loop ended; None until the stream is exhausted."""
        return self._outcome

    @property
    def ended(self) -> bool:
        """Whether the stream has been read to its end."""
        return self._outcome is not None

    def transcript(self) -> list[Chunk]:
        """The loop coalesced so far (protocol §11), as chunks."""
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

    __slots__ = ("_native", "_abandoned")

    def __init__(self, native: _native.Run) -> None:
        self._native = native
        self._abandoned = False

    @property
    def id(self) -> str:
        """The run's id, as the server minted it."""
        return self._native.id

    @property
    def ended(self) -> bool:
        """Whether the run has ended, or has been stopped by this side."""
        return self._abandoned or self._native.is_ended()

    def loop(self, prompt: str, *, transcript: bool = True) -> SyncStream:
        """Asks for one loop with ``prompt``; raises RunEnded if the run is over."""
        if self.ended:
            raise RunEnded(f"run {self.id} has ended: start a new run for another loop")
        return SyncStream(self, self._native.open_loop(prompt, transcript))

    def stop(self) -> None:
        """Stops the run and waits until the server says it has ended."""
        self._abandoned = True
        self._native.stop_blocking()

    def wait_ended(self) -> None:
        """Waits until the run has ended on the server."""
        self._native.wait_ended_blocking()

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

    __slots__ = ("_native",)

    def __init__(self, native: _native.Client) -> None:
        self._native = native

    def start(
        self,
        name: Optional[str] = None,
        *,
        image: Optional[Mapping[str, Any]] = None,
        digest: Optional[str] = None,
        memory: Size = "1G",
        disk: Size = 0,
        agent: Any = None,
    ) -> SyncRun:
        """Opens a run and waits for its id (see ``Client.start``)."""
        args = start_args(name, image, digest, memory, disk, agent)
        return SyncRun(self._native.start_blocking(args))

    def close(self) -> None:
        """Closes the connection and waits for the close handshake."""
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
) -> SyncClient:
    """Connects, blocking (see ``connect``)."""
    return SyncClient(_native.connect_blocking(url, token, authorities(ca), connect_timeout))
