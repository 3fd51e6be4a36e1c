"""The arguments of ``start`` and ``connect``, checked and put in the native layer's terms.

Only the caller's conveniences live here (sizes such as ``"1G"``, the agent
as any JSON-able value); the run request itself is built and checked by the
Rust client.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

Size = Union[int, str]
PathLike = Union[str, "os.PathLike[str]"]

#: How long any one wait after connecting may take by default, seconds: a
#: run's start, each event of a loop, a stop. A server that falls silent
#: cannot hold a caller longer than this.
DEFAULT_TIMEOUT = 300.0

#: The bytes of chunk JSON a loop's transcript keeps by default; past them
#: it is let go (``TranscriptTooLarge`` when asked for) and the loop goes on.
DEFAULT_TRANSCRIPT_LIMIT = 64 << 20


class ClientDefault:
    """The value of a call's ``timeout=`` that means "the client's own"."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CLIENT_DEFAULT"


CLIENT_DEFAULT = ClientDefault()

#: A call's ``timeout=``: seconds, None (no bound), or the client's.
Wait = Union[float, None, ClientDefault]


def seconds(value: Wait, default: Optional[float]) -> Optional[float]:
    """A call's bound in seconds: its own, or the client's ``default``."""
    return default if isinstance(value, ClientDefault) else value

_SCALE = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size(value: Size, what: str) -> int:
    """Bytes from an int or a string with an optional K/M/G/T suffix (powers of 1024)."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a byte count, not a bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{what} must not be negative: {value}")
        return value
    if isinstance(value, str):
        text = value.strip()
        scale = _SCALE.get(text[-1:].upper(), 1)
        digits = text[:-1] if scale != 1 else text
        if digits.isdigit():
            return int(digits) * scale
        raise ValueError(f"{what}: {value!r} is not a byte count (e.g. 512K, 16M, 1G)")
    raise TypeError(f"{what} must be an int or a string such as '1G'")


def start_args(
    name: Optional[str],
    image: Optional[Mapping[str, Any]],
    digest: Optional[str],
    memory: Size,
    disk: Size,
    agent: Any,
) -> Tuple[Optional[str], Optional[str], Optional[str], int, int, str]:
    """The native ``start``'s arguments."""
    if name is None and image is None:
        name = "demo"
    if image is not None and digest is not None:
        raise ValueError("digest= goes with an image name; put it inside image= instead")
    image_json = None if image is None else json.dumps(image)
    agent_json = json.dumps({} if agent is None else agent)
    return name, digest, image_json, size(memory, "memory"), size(disk, "disk"), agent_json


def authorities(ca: Union[None, PathLike, Sequence[PathLike]]) -> list[str]:
    """``ca=`` as a list of PEM file paths."""
    if ca is None:
        return []
    if isinstance(ca, (str, os.PathLike)):
        return [os.fspath(ca)]
    return [os.fspath(path) for path in ca]
