"""Callers of agent providers in Python: the run-loop protocol's Rust client, async first.

    async with runloop.connect("ws://127.0.0.1:7878", token=token) as client:
        run = await client.start("demo")
        async with run.loop("Count the words in this sentence") as stream:
            async for event in stream:
                if isinstance(event, runloop.Chunk):
                    print(event.kind, event.json)
        print(stream.outcome.kind)
        await run.stop()

The framing, the authorization, the sequence rules, the outcome and the
transcript are the Rust client's (the extension module ``runloop._native``);
this package gives them Python's shapes. See docs/python.md.
"""

import atexit as _atexit

from . import _native
from ._client import Client, Connecting, Event, Run, Stream, connect
from ._errors import (
    ConnectError,
    ConnectionLost,
    ConnectTimeout,
    NotEnded,
    RunEnded,
    RunloopError,
    RunNotServed,
    RunRefused,
    Timeout,
    TranscriptTooLarge,
    UsedAfterFork,
)
from ._native import Chunk, Error, Outcome
from ._request import CLIENT_DEFAULT, DEFAULT_TIMEOUT, DEFAULT_TRANSCRIPT_LIMIT
from ._sync import SyncClient, SyncRun, SyncStream, connect_sync

# The runtime's threads take the GIL no more once the interpreter exits.
_atexit.register(_native.at_exit)

__all__ = [
    "CLIENT_DEFAULT",
    "DEFAULT_TIMEOUT",
    "DEFAULT_TRANSCRIPT_LIMIT",
    "Chunk",
    "Client",
    "ConnectError",
    "ConnectTimeout",
    "Connecting",
    "ConnectionLost",
    "Error",
    "Event",
    "NotEnded",
    "Outcome",
    "Run",
    "RunEnded",
    "RunNotServed",
    "RunRefused",
    "RunloopError",
    "Stream",
    "SyncClient",
    "SyncRun",
    "SyncStream",
    "Timeout",
    "TranscriptTooLarge",
    "UsedAfterFork",
    "connect",
    "connect_sync",
]
