# Hand-written stubs of the extension module (python/src). Keep them in step
# with the #[pymethods] there: mypy --strict checks the package against them.

from __future__ import annotations

import os
from typing import Any, Awaitable, Optional, Sequence, Tuple, Union

BATCH: int
# The checkout the extension was built from (python/..), for python -m runloop run's advice.
CHECKOUT: str
# Whether the extension is a debug build (python/bench.py warns of one).
DEBUG: bool

_Path = Union[str, os.PathLike[str]]
# (name, digest, image JSON, memory, disk, agent JSON)
StartSpec = Tuple[Optional[str], Optional[str], Optional[str], int, int, str]

class Chunk:
    """One chunk of a loop (protocol §8)."""

    @property
    def kind(self) -> str:
        """The chunk's ``type``: ``"assistant_text_content"``, ``"tool_response"``, ..."""
    @property
    def json(self) -> str:
        """The chunk's JSON text exactly as the server sent it."""
    @property
    def data(self) -> dict[str, Any]:
        """The chunk parsed by ``json.loads`` (made once, then the same dict)."""
    @property
    def text(self) -> Optional[str]:
        """``text`` of a reasoning, text or refusal fragment; else None."""
    @property
    def id(self) -> Optional[str]:
        """``id`` of a tool call or a tool response; else None."""
    @property
    def name(self) -> Optional[str]:
        """``name`` of a tool call; else None."""
    @property
    def arguments(self) -> Optional[str]:
        """``arguments`` of a tool call (a fragment of JSON text); else None."""
    @property
    def parent_tool_call_id(self) -> Optional[str]:
        """The tool call whose sub-agent produced the chunk; None: the main thread."""
    @property
    def is_fatal(self) -> bool:
        """Whether this is a fatal notification: the loop's last word, a failure."""
    @property
    def message(self) -> Any:
        """``message`` of a notification (any JSON value); else None."""
    @property
    def prompt(self) -> Optional[str]:
        """``prompt`` of a user chunk; else None."""
    @property
    def mime_type(self) -> Optional[str]:
        """``mimeType`` of an image or audio chunk; else None."""
    @property
    def usage(self) -> Optional[Tuple[int, int, int]]:
        """``(completion_tokens, prompt_tokens, total_tokens)`` of a usage chunk; else None."""

class Error:
    """The loop's error: there was no loop, or it did not finish (protocol §9)."""

    @property
    def json(self) -> str:
        """The error value as JSON text."""
    @property
    def value(self) -> Any:
        """The error value, parsed: any JSON value."""

class Outcome:
    """How a loop ended."""

    @property
    def kind(self) -> str:
        """``"finished"``, ``"unfinished"``, ``"no_loop"``, ``"not_served"`` or ``"broken"``."""
    @property
    def fatal(self) -> bool:
        """Whether the loop finished with a fatal notification as its last chunk."""
    @property
    def error(self) -> Any:
        """The loop's error value (``unfinished``, ``no_loop``); else None."""
    @property
    def reason(self) -> Optional[str]:
        """Why the sequence broke (``broken``); else None."""
    @property
    def ok(self) -> bool:
        """Whether the loop finished and did not fail."""

class Loop:
    def take(self) -> Optional[list[Union[Chunk, Error]]]: ...
    def fileno(self) -> int: ...
    def drain(self) -> None: ...
    def next_batch_blocking(self, timeout: Optional[float]) -> Optional[list[Union[Chunk, Error]]]: ...
    def outcome(self) -> Optional[Outcome]: ...
    def transcript(self) -> list[Chunk]: ...

class Run:
    @property
    def id(self) -> str: ...
    def open_loop(self, prompt: str, transcript_limit: Optional[int]) -> Loop: ...
    def stop_nowait(self) -> None: ...
    def stop(self, timeout: Optional[float]) -> Awaitable[None]: ...
    def stop_blocking(self, timeout: Optional[float]) -> None: ...
    def wait_ended(self, timeout: Optional[float]) -> Awaitable[None]: ...
    def wait_ended_blocking(self, timeout: Optional[float]) -> None: ...
    def is_ended(self) -> bool: ...

class Client:
    def start(self, spec: StartSpec, timeout: Optional[float]) -> Awaitable[Run]: ...
    def start_blocking(self, spec: StartSpec, timeout: Optional[float]) -> Run: ...
    def close(self) -> Awaitable[None]: ...
    def close_blocking(self) -> None: ...
    def is_closed(self) -> bool: ...

def connect(
    url: str, token: str, ca: Sequence[_Path], connect_timeout: Optional[float]
) -> Awaitable[Client]: ...
def connect_blocking(
    url: str, token: str, ca: Sequence[_Path], connect_timeout: Optional[float]
) -> Client: ...
def rust_client_loop(url: str, token: str, image: str, prompt: str) -> Tuple[int, float, str]: ...
def at_exit() -> None: ...
