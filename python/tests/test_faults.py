"""Faults named as what they are, and waits that end (issue 40 item 9):
a server killed mid-start, a message over the limit, a torn frame, a
server that falls silent, a transcript past its bound. Each against a real
``runloop serve`` or a real socket whose far side misbehaves."""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
import time
from typing import Callable, Iterator

import pytest
from websockets.sync.server import ServerConnection, serve

import runloop
from conftest import Server

PROMPT = "Count the words in this sentence"
# The client's default message limit (runloop_wire::limits::Limits).
MAX_MESSAGE = 16 << 20


Behaviour = Callable[[ServerConnection], None]


def fake_server(behaviour: Behaviour) -> Iterator[str]:
    """A WebSocket server on loopback that reads the authorization and the run
    request, then does ``behaviour``; yields its URL."""

    def handler(connection: ServerConnection) -> None:
        try:
            connection.recv()  # the authorization
            connection.recv()  # the run request
            behaviour(connection)
        except Exception:  # noqa: BLE001 - the client may leave first
            pass

    with serve(handler, "127.0.0.1", 0, compression=None, max_size=None, ping_interval=None) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        host, port = server.socket.getsockname()[:2]
        try:
            yield f"ws://{host}:{port}"
        finally:
            server.shutdown()
            thread.join(5)


@pytest.fixture
def oversized() -> Iterator[str]:
    def send_too_much(connection: ServerConnection) -> None:
        connection.send(b"\x05" + bytes(MAX_MESSAGE + 16))
        time.sleep(2)

    yield from fake_server(send_too_much)


@pytest.fixture
def torn() -> Iterator[str]:
    def tear(connection: ServerConnection) -> None:
        # A binary frame whose header promises 1000 bytes; 10 come, then
        # the socket closes.
        connection.socket.sendall(b"\x82\x7e\x03\xe8" + bytes(10))
        connection.socket.shutdown(socket.SHUT_RDWR)

    yield from fake_server(tear)


@pytest.fixture
def silent() -> Iterator[str]:
    def say_nothing(connection: ServerConnection) -> None:
        time.sleep(5)

    yield from fake_server(say_nothing)


async def test_a_server_killed_mid_start_is_a_lost_connection_not_a_credential() -> None:
    # No token: the server takes any credential, and the caller sends none
    # (as the issue found it: "it wants a credential, and none was sent").
    # The exec agent never listens, so the run's start is still going on
    # when the server is killed.
    server = Server(["--agent", "slow=exec:sleep 60"], token=None)
    try:
        async with runloop.connect(server.url) as client:
            starting = asyncio.ensure_future(client.start("slow", memory="64M"))
            await asyncio.sleep(0.5)
            assert not starting.done()
            server.kill()
            with pytest.raises(runloop.ConnectionLost) as lost:
                await starting
    finally:
        server.stop()
    message = str(lost.value)
    assert "credential" not in message, message
    assert "broke with no close handshake (did the server stop?)" in message, message
    assert not isinstance(lost.value, runloop.ConnectError)


async def test_a_message_over_the_limit_is_named_not_the_credential(oversized: str) -> None:
    async with runloop.connect(oversized, token="t") as client:
        with pytest.raises(runloop.ConnectionLost) as lost:
            await client.start("demo", timeout=10)
    message = str(lost.value)
    assert f"over this client's max_message_size of {MAX_MESSAGE} bytes" in message, message
    assert "credential" not in message, message


def test_a_torn_frame_is_named_not_the_credential(torn: str) -> None:
    with runloop.connect_sync(torn, token="t") as client:
        with pytest.raises(runloop.ConnectionLost) as lost:
            client.start("demo", timeout=10)
    message = str(lost.value)
    assert "credential" not in message, message
    assert "the connection ended before the run started" in message, message


def test_a_silent_server_cannot_hang_a_blocking_start(silent: str) -> None:
    began = time.monotonic()
    with runloop.connect_sync(silent, token="t", timeout=0.5) as client:
        with pytest.raises(runloop.Timeout) as timed_out:
            client.start("demo")
        assert time.monotonic() - began < 3
    assert isinstance(timed_out.value, TimeoutError)
    assert "the run's start did not come within 0.5 s" in str(timed_out.value)


async def test_a_silent_server_cannot_hang_an_async_start(silent: str) -> None:
    async with runloop.connect(silent, token="t") as client:
        began = asyncio.get_running_loop().time()
        with pytest.raises(runloop.Timeout):
            await client.start("demo", timeout=0.3)
        assert asyncio.get_running_loop().time() - began < 3


def test_the_blocking_api_bounds_every_wait_by_default() -> None:
    assert runloop.DEFAULT_TIMEOUT == 300.0
    for connect in (runloop.connect_sync, runloop.connect):
        assert inspect.signature(connect).parameters["timeout"].default == runloop.DEFAULT_TIMEOUT


def test_a_blocking_loop_that_falls_silent_times_out_and_stops_its_run(server: Server) -> None:
    with runloop.connect_sync(server.url, token=server.token) as client:
        run = client.start("demo", memory="64M")
        began = time.monotonic()
        with pytest.raises(runloop.Timeout, match="the loop's next event did not come within 0.3 s"):
            with run.loop("demo:pace=3000 " + PROMPT, timeout=0.3) as stream:
                for _ in stream:
                    pass
        assert time.monotonic() - began < 2.5
        assert run.ended
        run.wait_ended(timeout=5)


async def test_an_async_loop_that_falls_silent_times_out_and_stops_its_run(server: Server) -> None:
    async with runloop.connect(server.url, token=server.token) as client:
        run = await client.start("demo", memory="64M")
        began = asyncio.get_running_loop().time()
        with pytest.raises(runloop.Timeout, match="the loop's next event did not come within 0.3 s"):
            async with run.loop("demo:pace=3000 " + PROMPT, timeout=0.3) as stream:
                async for _ in stream:
                    pass
        assert asyncio.get_running_loop().time() - began < 2.5
        assert run.ended
        await run.wait_ended(timeout=5)


async def test_a_transcript_past_its_bound_is_let_go_and_the_loop_goes_on(server: Server) -> None:
    async with runloop.connect(server.url, token=server.token) as client:
        run = await client.start("demo", memory="64M")
        async with run.loop(PROMPT, transcript_limit=100) as stream:
            events = [event async for event in stream]
        await run.stop()
    # The loop is whole...
    assert stream.outcome.kind == "finished"
    assert len(events) > 5
    # ...its transcript is not kept, and asking for it says why.
    with pytest.raises(runloop.TranscriptTooLarge) as dropped:
        stream.transcript()
    assert dropped.value.limit == 100
    assert "passed its bound of 100 bytes" in str(dropped.value)
    assert "the loop itself went on" in str(dropped.value)


def test_the_default_transcript_is_bounded(server: Server) -> None:
    assert runloop.DEFAULT_TRANSCRIPT_LIMIT == 64 << 20
    with runloop.connect_sync(server.url, token=server.token) as client:
        with client.start("demo", memory="64M") as run:
            with run.loop(PROMPT) as stream:
                for _ in stream:
                    pass
            assert [chunk.kind for chunk in stream.transcript()].count("assistant_text_content") == 1
            with run.loop(PROMPT, transcript_limit="1K") as small:
                for _ in small:
                    pass
            with pytest.raises(runloop.TranscriptTooLarge, match="1024 bytes"):
                small.transcript()
