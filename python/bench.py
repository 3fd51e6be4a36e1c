"""Chunks per second of one loop, and the caller's CPU per chunk: this package
against a pure-Python client.

    python bench.py [--agent exec|synthetic] [--chunks N] [--rounds R] [--mix MIX]
                    [--rate R] [--runloop PATH]

Both clients read the same loops from the same ``runloop serve``. With
``--agent exec`` (the default) it is the whole chain as a user runs it:
the server's catalog entry is an ``exec:`` agent program (``runloop
__sse-agent``, the one ``runloop bench --chain`` uses: SSE over HTTP/1.1,
one process per run, the proxy in the server), which streams as fast as
its socket takes the events, or at ``--rate``, so the source is never
what is measured. With ``--agent synthetic`` the server stands in front
of the bench's synthetic proxy (``runloop __synthetic-proxy``: framed
chunks, no SSE). The
pure-Python client speaks the same protocol on the ``websockets`` library,
written as a competent engineer would: its asyncio API, the message limit
raised, compression off, the 9-byte header read in one ``struct`` call,
the chunk JSON kept as bytes. A third side, the Rust client alone (in the
extension, no Python per chunk), is the ceiling.

Each side's figures are its chunks per second and the CPU time of this
process (every thread: the extension's runtime included) per chunk. At a
``--rate`` every side reads at the rate, and the CPU per chunk is the
figure: the paced regime, where chunks come one by one and a caller pays
its cost of handing each over.

Sides take turns, in an order that turns around every round; each figure
is the median of its rounds, and the ratios are medians of per-round
ratios. Measure release builds: ``cargo build --release -p runloop-cli``
and ``maturin develop --release`` (a debug build prints a warning).
"""

from __future__ import annotations

import argparse
from importlib.metadata import version
import asyncio
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable, Optional

from websockets.asyncio.client import connect as ws_connect

import runloop
from runloop import _native

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "runloop-python-bench"
IMAGE = "bench"
ANY_DIGEST = "sha256:" + "0" * 64
HEADER = struct.Struct(">BII")
#: Issue 39's bar: the package against the pure-Python caller.
BAR = 1.5


#: One loop's figures: (chunks, seconds of the loop, CPU seconds of this process).
Figures = tuple[int, float, float]


def prompt(index: int, chunks: int, rate: int) -> str:
    """The synthetic proxy's loop: ``bench:INDEX:ROUND:CHUNKS:RATE`` (rate 0: unpaced)."""
    return f"bench:{index}:0:{chunks}:{rate}"


async def package_loop(url: str, text: str, transcript: bool) -> Figures:
    """One loop through this package."""
    async with runloop.connect(url, token=TOKEN) as client:
        run = await client.start(IMAGE)
        began = time.perf_counter()
        cpu = time.process_time()
        chunks = 0
        last: Optional[runloop.Event] = None
        async with run.loop(text, transcript=transcript) as stream:
            async for event in stream:
                chunks += 1
                last = event
        took = time.perf_counter() - began
        cpu = time.process_time() - cpu
        assert stream.outcome.kind == "finished", stream.outcome
        assert last is not None
        await run.stop()
    return chunks, took, cpu


async def pure_python_loop(url: str, text: str) -> Figures:
    """One loop through a pure-Python client of the same protocol on ``websockets``."""
    async with ws_connect(url, max_size=None, compression=None, max_queue=None) as ws:
        # Authorization (type 0, mode 0 = unbrokered), then a run on scope 1.
        await ws.send(HEADER.pack(0, 0, 0) + b"\x00" + TOKEN.encode())
        request = {
            "image": {"server": {"name": IMAGE, "digest": ANY_DIGEST}},
            "memory": 1 << 30,
            "disk": 0,
            "agent": {},
        }
        await ws.send(HEADER.pack(1, 1, 0) + b"\x00" + json.dumps(request).encode())
        while True:
            message = await ws.recv()
            assert isinstance(message, bytes)
            if message[0] == 2 and int.from_bytes(message[1:5], "big") == 1:
                assert message[9] == 0, message
                break
        # The loop on channel 1 (tag 5: run-loop).
        await ws.send(HEADER.pack(4, 1, 1) + b"\x05" + json.dumps({"prompt": text}).encode())
        unpack_header = HEADER.unpack_from
        began = time.perf_counter()
        cpu = time.process_time()
        chunks = 0
        last = b""
        finished = False
        while True:
            message = await ws.recv()
            if not isinstance(message, bytes) or len(message) < 9:
                continue
            kind, scope, channel = unpack_header(message)
            if scope != 1:
                continue
            if kind == 5 and channel == 1:
                if message[9] == 0:
                    chunks += 1
                    last = message[10:]
                else:
                    break  # the error: the loop's last response
            elif kind == 6 and channel == 1:
                finished = True
                break
            elif kind == 3:
                break  # the run ended
        took = time.perf_counter() - began
        cpu = time.process_time() - cpu
        assert finished and last, "the loop did not finish"
        # Stop (channel 2, tag 0), and wait for the scope's finish.
        await ws.send(HEADER.pack(4, 1, 2) + b"\x00")
        while True:
            message = await ws.recv()
            if isinstance(message, bytes) and message[0] == 3:
                break
    return chunks, took, cpu


async def rust_loop(url: str, text: str) -> Figures:
    """One loop read by the Rust client alone, in the extension (the ceiling).
    Its CPU includes the connection and the run's start, a little more than the loop's."""
    cpu = time.process_time()
    chunks, took, ending = await asyncio.to_thread(_native.rust_client_loop, url, TOKEN, IMAGE, text)
    assert ending == "finished", ending
    return chunks, took, time.process_time() - cpu


def spawn(command: list[str], env: Optional[dict[str, str]] = None) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    url = child.stdout.readline().strip()
    if not url.startswith("ws://"):
        child.kill()
        raise SystemExit(f"{command[:2]} did not start: {url!r}")
    return child, url


#: One side's figures over the rounds: chunks per second, CPU microseconds per chunk.
Rates = dict[str, tuple[list[float], list[float]]]


async def measure(url: str, chunks: int, rounds: int, rate: int) -> Rates:
    sides: dict[str, Callable[[str], Awaitable[Figures]]] = {
        "package": lambda text: package_loop(url, text, True),
        "package, transcript=False": lambda text: package_loop(url, text, False),
        "pure Python (websockets)": lambda text: pure_python_loop(url, text),
        "Rust client": lambda text: rust_loop(url, text),
    }
    names = list(sides)
    rates: Rates = {name: ([], []) for name in names}
    # A warm-up loop on each side, not counted.
    for name in names:
        await sides[name](prompt(0, min(chunks, 2000), rate))
    for index in range(rounds):
        order = names if index % 2 == 0 else list(reversed(names))
        for name in order:
            got, took, cpu = await sides[name](prompt(index + 1, chunks, rate))
            assert got == chunks, f"{name}: {got} of {chunks} chunks"
            rates[name][0].append(got / took)
            rates[name][1].append(cpu / got * 1e6)
    return rates


#: Each source's default chunk sizes: the synthetic proxy's small chunks, and
#: the whole chain's mix of issue 39 (``runloop bench``'s default: 95 % small
#: text deltas, 5 % tool responses of 2 to 20 KiB).
MIXES = {"synthetic": "20-200:1", "exec": "20-200:95,2K-20K:5"}


def serve(binary: Path, agent: str, mix: str) -> list[tuple[subprocess.Popen[str], str]]:
    """The children the loops are read through, the server last (its URL)."""
    env = dict(os.environ, RUNLOOP_TOKEN=TOKEN, RUST_LOG="warn")
    command = [str(binary), "serve", "--listen", "127.0.0.1:0"]
    if agent == "exec":
        # An exec run asks for no disk, which a host process cannot be held
        # to anyway (as runloop bench --chain says too).
        program = f"{binary} __sse-agent --mix {mix}"
        server = spawn(command + ["--agent", f"{IMAGE}=exec:{program}", "--exec-disk", "unenforced"], env)
        return [server]
    proxy = spawn([str(binary), "__synthetic-proxy", "--mix", mix])
    try:
        server = spawn(command + ["--agent", f"{IMAGE}=proxy:{proxy[1]}"], env)
    except BaseException:
        proxy[0].kill()
        proxy[0].wait()
        raise
    return [proxy, server]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", choices=sorted(MIXES), default="exec",
                        help="what the server runs: the synthetic proxy, or an exec: agent program")
    parser.add_argument("--chunks", type=int, default=200_000, help="chunks per loop")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (each side once a round)")
    parser.add_argument("--mix", default=None,
                        help="chunk sizes, as runloop bench --mix (default: the source's, see MIXES)")
    parser.add_argument("--rate", type=int, default=0,
                        help="chunks a second the source sends (0: as fast as they are read)")
    parser.add_argument("--runloop", default=None, help="the runloop binary (default: target/release)")
    args = parser.parse_args()
    mix = args.mix or MIXES[args.agent]
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    binary = Path(args.runloop) if args.runloop else target / "release" / "runloop"
    if not binary.exists():
        print(f"{binary} is missing: cargo build --release -p runloop-cli", file=sys.stderr)
        return 2
    if _native.DEBUG:
        print("the extension is a debug build: maturin develop --release for figures", file=sys.stderr)
    children = serve(binary.resolve(), args.agent, mix)
    url = children[-1][1]
    try:
        rates = asyncio.run(measure(url, args.chunks, args.rounds, args.rate))
    finally:
        for child, _ in reversed(children):
            child.kill()
            child.wait()
    base = "pure Python (websockets)"
    pace = f"{args.rate:,} a second" if args.rate else "unpaced"
    source = "an exec: agent program" if args.agent == "exec" else "the synthetic proxy"
    print(f"one loop of {args.chunks} chunks from {source} (sizes {mix}, {pace}), {args.rounds} rounds, "
          f"websockets {version('websockets')}, Python {sys.version.split()[0]}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"  {'':28} {'chunks/s':>12} {'':>18} {'CPU/chunk':>10}")
    for name, (per_second, cpu) in rates.items():
        line = f"  {name:28} {statistics.median(per_second):>12,.0f}"
        if name != base:
            ratio = statistics.median(a / b for a, b in zip(per_second, rates[base][0]))
            line += f"   {ratio:5.2f}x pure Python"
        else:
            line += " " * 21
        line += f" {statistics.median(cpu):>8.2f} us"
        if name != base:
            ratio = statistics.median(a / b for a, b in zip(cpu, rates[base][1]))
            line += f"   {ratio:5.2f}x pure Python's"
        print(line)
    package = rates["package"][0]
    to_rust = statistics.median(a / b for a, b in zip(package, rates["Rust client"][0]))
    print(f"  the package reads at {to_rust:.2f}x the Rust client's rate")
    # Issue 39's bar: the package (its defaults: a transcript kept) at 1.5x
    # a pure-Python caller. Unpaced that is chunks/s; paced every side
    # reads at the rate, and it is CPU per chunk (the pure caller's over
    # the package's, so that more is better either way).
    if args.rate:
        cpu = rates["package"][1]
        figure = statistics.median(b / a for a, b in zip(cpu, rates[base][1]))
        what = "pure Python's CPU per chunk over the package's"
    else:
        figure = statistics.median(a / b for a, b in zip(package, rates[base][0]))
        what = "the package's chunks/s over pure Python's"
    verdict = "met" if figure >= BAR else "NOT met"
    print(f"  issue 39's bar: {what}, {figure:.2f}x (at least {BAR}x: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
