"""The async API: connect, start a run, stream its loops.

Every wait is an awaitable of the Rust client running on the extension's
own tokio runtime, or a wait in the event loop itself; the event loop is
never blocked. A loop is handed over in batches: every event already
there comes in one crossing from the runtime to Python, and when none is,
the stream waits for its wake-up descriptor in the event loop (one byte
written by the runtime, read by the event loop's selector), so no thread
of the runtime takes the GIL to hand Python a chunk.

Cancellation is the protocol's: a loop ends only when its run is stopped
(protocol §6), so a task cancelled while it reads a stream, a stream's
``async with`` left before its end, or a wait for the next event that
times out, stops the run at once. The run then says it has ended, and a
new ``start`` works at once.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, Generator, Mapping, Optional, Sequence, Type, Union

from . import _native
from ._errors import NotEnded, RunEnded, Timeout
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
    size,
    start_args,
)

Event = Union[Chunk, Error]


def loop_args(transcript: bool, transcript_limit: Size) -> Optional[int]:
    """The native ``open_loop``'s transcript bound (None: keep none)."""
    return size(transcript_limit, "transcript_limit") if transcript else None


class Stream:
    """One loop: an async iterator of ``Chunk`` and ``Error``, in order.

    When it is exhausted, ``outcome`` says how the loop ended and
    ``transcript()`` gives it coalesced (protocol §11). Use it as an async
    context manager: leaving early stops the run.
    """

    __slots__ = (
        "_run",
        "_native",
        "_batch",
        "_at",
        "_outcome",
        "_timeout",
        "_loop",
        "_waiter",
        "_since",
        "_timer",
    )

    def __init__(self, run: Run, native: _native.Loop, timeout: Optional[float]) -> None:
        self._run = run
        self._native = native
        self._batch: list[Event] = []
        self._at = 0
        self._outcome: Optional[Outcome] = None
        self._timeout = timeout
        # While the stream waits in an event loop: that loop (which watches
        # the wake-up descriptor), the waiter, when the wait began, and the
        # timer that looks at the wait's age.
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._waiter: Optional[asyncio.Future[None]] = None
        self._since = 0.0
        self._timer: Optional[asyncio.TimerHandle] = None

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
        native = self._native
        try:
            taken = native.take()
            while taken is not None and not taken:
                await self._wait()
                taken = native.take()
        except BaseException:
            # Cancelled, interrupted or timed out mid-loop: the loop can
            # only end by its run's end, so the run is stopped now.
            self._unwatch()
            self._run._abandon()
            raise
        if taken is None:
            self._unwatch()
            self._outcome = native.outcome()
            raise StopAsyncIteration
        self._batch = taken
        self._at = 1
        return taken[0]

    def _wait(self) -> asyncio.Future[None]:
        """A future that is done when events are ready (``take`` found none).

        The event loop watches the wake-up descriptor from the first wait to
        the stream's end: one byte written there by the runtime wakes it.
        """
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._unwatch()
            loop.add_reader(self._native.fileno(), self._woken)
            self._loop = loop
            if self._timeout is not None:
                self._timer = loop.call_later(self._timeout, self._look)
        waiter = loop.create_future()
        self._waiter = waiter
        if self._timeout is not None:
            self._since = loop.time()
        return waiter

    def _woken(self) -> None:
        """The wake-up descriptor is readable: events are ready."""
        self._native.drain()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _look(self) -> None:
        """The timer: fails a wait older than ``timeout``, else looks again later."""
        loop, limit, waiter = self._loop, self._timeout, self._waiter
        if loop is None or limit is None:
            return
        waiting = waiter is not None and not waiter.done()
        due = (self._since if waiting else loop.time()) + limit
        if waiting and loop.time() >= due and waiter is not None:
            waiter.set_exception(
                Timeout(f"the loop's next event did not come within {limit} s (timeout={limit})")
            )
            return
        self._timer = loop.call_at(due, self._look)

    def _unwatch(self) -> None:
        """The event loop stops watching the descriptor (the stream is done with it)."""
        loop = self._loop
        if loop is None:
            return
        self._loop = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not loop.is_closed():
            loop.remove_reader(self._native.fileno())

    def __del__(self) -> None:
        # A stream dropped mid-wait: its descriptor closes with it, and
        # must not stay in the event loop's selector.
        try:
            self._unwatch()
        except Exception:  # noqa: BLE001 - nothing to be done at collection
            pass

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
        """The loop coalesced so far (protocol §11), as chunks.

        Raises TranscriptTooLarge when it passed ``transcript_limit``, and
        RunloopError when the loop was opened with ``transcript=False``.
        """
        return self._native.transcript()

    async def __aenter__(self) -> Stream:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self._unwatch()
        if self._outcome is None:
            self._run._abandon()


class Run:
    """A run: a container the server started for this connection.

    ``loop(prompt)`` asks for one loop (a proxy serves one at a time).
    As an async context manager, it is stopped on exit.
    """

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
    ) -> Stream:
        """Asks for one loop with ``prompt``; raises RunEnded if the run is over.

        ``transcript=False`` keeps no coalesced copy of the loop; one is
        kept up to ``transcript_limit`` bytes of chunk JSON (64M), then let
        go. ``timeout``: seconds the stream waits for each event (the
        client's by default; None: no bound); past it, Timeout, and the run
        is stopped.
        """
        if self.ended:
            raise RunEnded(f"run {self.id} has ended: start a new run for another loop")
        native = self._native.open_loop(prompt, loop_args(transcript, transcript_limit))
        return Stream(self, native, seconds(timeout, self._timeout))

    async def stop(self, *, timeout: Wait = CLIENT_DEFAULT) -> None:
        """Stops the run and waits until the server says it has ended."""
        self._abandoned = True
        await self._native.stop(seconds(timeout, self._timeout))

    async def wait_ended(self, *, timeout: Wait = CLIENT_DEFAULT) -> None:
        """Waits until the run has ended on the server."""
        await self._native.wait_ended(seconds(timeout, self._timeout))

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
    """A connection to a provider server; many runs at once on it.

    ``timeout`` bounds each of its waits (seconds; None: no bound) unless a
    call says otherwise.
    """

    __slots__ = ("_native", "_timeout")

    def __init__(self, native: _native.Client, timeout: Optional[float] = DEFAULT_TIMEOUT) -> None:
        self._native = native
        self._timeout = timeout

    async def start(
        self,
        name: Optional[str] = None,
        *,
        image: Optional[Mapping[str, Any]] = None,
        digest: Optional[str] = None,
        memory: Size = "1G",
        disk: Size = 0,
        agent: Any = None,
        timeout: Wait = CLIENT_DEFAULT,
    ) -> Run:
        """Opens a run of the catalog image ``name`` (default ``"demo"``), or of
        ``image`` (``{"registry": {"reference": ...}}``, ...), and waits for its id.

        Raises RunRefused (with the server's ``error``), RunNotServed,
        ConnectError when the connection is turned away (a refused
        credential), ConnectionLost when it ended otherwise, Timeout past
        ``timeout`` (the client's by default).
        """
        args = start_args(name, image, digest, memory, disk, agent)
        limit = seconds(timeout, self._timeout)
        return Run(await self._native.start(args, limit), self._timeout)

    async def close(self) -> None:
        """Closes the connection (every run on it ends) and waits for the close
        handshake (2 s at most)."""
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

    __slots__ = ("_url", "_token", "_ca", "_connect_timeout", "_timeout", "_client")

    def __init__(
        self,
        url: str,
        token: str,
        ca: list[str],
        connect_timeout: Optional[float],
        timeout: Optional[float],
    ) -> None:
        self._url = url
        self._token = token
        self._ca = ca
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._client: Optional[Client] = None

    async def _connect(self) -> Client:
        native = await _native.connect(self._url, self._token, self._ca, self._connect_timeout)
        return Client(native, self._timeout)

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
    timeout: Optional[float] = DEFAULT_TIMEOUT,
) -> Connecting:
    """Connects to the provider server at ``url`` (``ws://`` or ``wss://``) with ``token``.

    ``ca``: PEM files of certificate authorities to trust besides the
    platform's. ``connect_timeout``: seconds for TCP, TLS, the WebSocket
    upgrade and the authorization (None: no limit); ConnectTimeout past it.
    ``timeout``: seconds any one later wait may take (a run's start, each
    event of a loop, a stop; 300 by default, None: no bound), unless the
    call gives its own; Timeout past it.
    """
    return Connecting(url, token, authorities(ca), connect_timeout, timeout)
