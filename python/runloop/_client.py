"""The async API: connect, start a run, stream its loops.

Every wait is an awaitable of the Rust client running on the extension's
own tokio runtime; the event loop is never blocked. A loop is read in
batches (every event already queued comes with one await), and handed out
one event at a time.

Cancellation is the protocol's: a loop ends only when its run is stopped
(protocol §6), so a task cancelled while it reads a stream, or a stream's
``async with`` left before its end, stops the run at once. The run then
says it has ended, and a new ``start`` works at once.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Generator, Mapping, Optional, Sequence, Type, Union

from . import _native
from ._errors import RunEnded
from ._native import Chunk, Error, Outcome
from ._request import PathLike, Size, authorities, start_args

Event = Union[Chunk, Error]


class Stream:
    """One loop: an async iterator of ``Chunk`` and ``Error``, in order.

    When it is exhausted, ``outcome`` says how the loop ended and
    ``transcript()`` gives it coalesced (protocol §11). Use it as an async
    context manager: leaving early stops the run.
    """

    __slots__ = ("_run", "_native", "_batch", "_at", "_outcome")

    def __init__(self, run: Run, native: _native.Loop) -> None:
        self._run = run
        self._native = native
        self._batch: list[Event] = []
        self._at = 0
        self._outcome: Optional[Outcome] = None

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Event:
        at = self._at
        batch = self._batch
        if at < len(batch):
            self._at = at + 1
            return batch[at]
        if self._outcome is not None:
            raise StopAsyncIteration
        try:
            batch = await self._native.next_batch()
        except BaseException:
            # Cancelled (or interrupted) mid-loop: the loop can only end by
            # its run's end, so the run is stopped now.
            self._run._abandon()
            raise
        if not batch:
            self._outcome = self._native.outcome()
            raise StopAsyncIteration
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

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._outcome is None:
            self._run._abandon()


class Run:
    """A run: a container the server started for this connection.

    ``loop(prompt)`` asks for one loop (a proxy serves one at a time).
    As an async context manager, it is stopped on exit.
    """

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

    def loop(self, prompt: str, *, transcript: bool = True) -> Stream:
        """Asks for one loop with ``prompt``; raises RunEnded if the run is over.

        ``transcript=False`` keeps no coalesced copy of the loop.
        """
        if self.ended:
            raise RunEnded(f"run {self.id} has ended: start a new run for another loop")
        return Stream(self, self._native.open_loop(prompt, transcript))

    async def stop(self) -> None:
        """Stops the run and waits until the server says it has ended."""
        self._abandoned = True
        await self._native.stop()

    async def wait_ended(self) -> None:
        """Waits until the run has ended on the server."""
        await self._native.wait_ended()

    def _abandon(self) -> None:
        """Sends the stop without waiting: the way out of a cancelled loop."""
        self._abandoned = True
        self._native.stop_nowait()

    async def __aenter__(self) -> Run:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if exc_type is None:
            await self.stop()
        else:
            self._abandon()

    def __repr__(self) -> str:
        return f"Run(id={self.id!r}, ended={self.ended})"


class Client:
    """A connection to a provider server; many runs at once on it."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.Client) -> None:
        self._native = native

    async def start(
        self,
        name: Optional[str] = None,
        *,
        image: Optional[Mapping[str, Any]] = None,
        digest: Optional[str] = None,
        memory: Size = "1G",
        disk: Size = 0,
        agent: Any = None,
    ) -> Run:
        """Opens a run of the catalog image ``name`` (default ``"demo"``), or of
        ``image`` (``{"registry": {"reference": ...}}``, ...), and waits for its id.

        Raises RunRefused (with the server's ``error``), RunNotServed, or
        ConnectError when the connection is turned away (a refused credential).
        """
        args = start_args(name, image, digest, memory, disk, agent)
        return Run(await self._native.start(args))

    async def close(self) -> None:
        """Closes the connection (every run on it ends) and waits for the close handshake."""
        await self._native.close()

    @property
    def closed(self) -> bool:
        """Whether the connection is over."""
        return self._native.is_closed()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()


class Connecting:
    """What ``connect`` returns: await it, or use it as ``async with``."""

    __slots__ = ("_url", "_token", "_ca", "_timeout", "_client")

    def __init__(self, url: str, token: str, ca: list[str], timeout: Optional[float]) -> None:
        self._url = url
        self._token = token
        self._ca = ca
        self._timeout = timeout
        self._client: Optional[Client] = None

    async def _connect(self) -> Client:
        native = await _native.connect(self._url, self._token, self._ca, self._timeout)
        return Client(native)

    def __await__(self) -> Generator[Any, None, Client]:
        return self._connect().__await__()

    async def __aenter__(self) -> Client:
        self._client = await self._connect()
        return self._client

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._client is not None:
            await self._client.close()


def connect(
    url: str,
    token: str = "",
    *,
    ca: Union[None, PathLike, Sequence[PathLike]] = None,
    connect_timeout: Optional[float] = 10.0,
) -> Connecting:
    """Connects to the provider server at ``url`` (``ws://`` or ``wss://``) with ``token``.

    ``ca``: PEM files of certificate authorities to trust besides the
    platform's. ``connect_timeout``: seconds for TCP, TLS, the WebSocket
    upgrade and the authorization (None: no limit); ConnectTimeout past it.
    """
    return Connecting(url, token, authorities(ca), connect_timeout)
