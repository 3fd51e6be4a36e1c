"""``python -m runloop run "prompt"``: one loop, as ``runloop run`` runs it
(a catalog image, pinned or not, or a registry image; the run's memory and
disk).

Without ``--url`` a demo server with the built-in demo agent serves on a
loopback port: the ``runloop`` command's ``serve``, run as a child process
(``RUNLOOP_BIN``, else ``runloop`` on ``PATH``; see ``_demo``). The exit code is the loop's ending, with the CLI's
numbers: 0 finished, 1 unfinished, 3 no loop, 4 not served, 5 broken,
6 finished with a fatal notification, 7 refused, 8 timed out, 2 anything
else; Ctrl-C stops the run and exits 130.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, Optional, Sequence

from . import _demo
from ._client import connect
from ._errors import ConnectError, RunloopError, RunNotServed, RunRefused, Timeout
from ._native import Chunk, Error, Outcome

EXIT = {"finished": 0, "unfinished": 1, "no_loop": 3, "not_served": 4, "broken": 5}


def exit_code(outcome: Outcome) -> int:
    """The CLI's exit code for an ending."""
    return 6 if outcome.fatal else EXIT[outcome.kind]


def show(event: "Chunk | Error", as_json: bool) -> None:
    """One event: a JSON line, or the text a person reads."""
    if isinstance(event, Chunk):
        if as_json:
            print('{"chunk":%s}' % event.json.replace("\n", " "))
        elif event.kind in ("assistant_text_content", "assistant_reasoning", "assistant_refusal"):
            print(event.text, end="", flush=True)
        elif event.kind == "assistant_tool_call":
            if event.arguments is None or event.arguments.startswith("{"):
                print(f"\n{event.name}(", end="")
            print(event.arguments or "", end="", flush=True)
        elif event.kind == "tool_response":
            print(f")\n  -> {event.data.get('content')}")
        elif event.kind == "notification":
            print(f"\n[{'fatal' if event.is_fatal else 'notification'}] {event.message}")
        elif event.kind == "usage" and event.usage is not None:
            print(f"\n[usage] {event.usage[2]} tokens")
    elif as_json:
        print('{"error":%s}' % event.json)
    else:
        print(f"\nerror: {event.value}", file=sys.stderr)


def image_of(args: argparse.Namespace) -> dict[str, Any]:
    """``start``'s image arguments from ``--image NAME[@DIGEST]`` or
    ``--registry-image REF``, with ``--memory`` and ``--disk``."""
    sizes = {"memory": args.memory, "disk": args.disk}
    if args.registry_image is not None:
        return {"image": {"registry": {"reference": args.registry_image}}, **sizes}
    name, _, digest = args.image.partition("@")
    return {"name": name, "digest": digest or None, **sizes}


async def run(url: str, token: str, image: dict[str, Any], prompt: str, as_json: bool) -> int:
    async with connect(url, token=token) as client:
        try:
            started = await client.start(**image)
        except (RunRefused, RunNotServed, ConnectError) as error:
            # Refused, not served, or turned away before any answer (a
            # refused credential): no loop ran.
            print(f"runloop: {error}", file=sys.stderr)
            return 7
        try:
            async with started.loop(prompt) as stream:
                async for event in stream:
                    show(event, as_json)
        finally:
            if not started.ended:
                await started.stop()
    outcome = stream.outcome
    if as_json:
        line = '{"outcome":"%s"' % outcome.kind
        if outcome.reason is not None:
            line += ',"reason":%s' % json.dumps(outcome.reason)
        if outcome.fatal:
            line += ',"fatal":true'
        print(line + "}")
    else:
        print(f"\n[{outcome.kind}{', fatal' if outcome.fatal else ''}]", file=sys.stderr)
    return exit_code(outcome)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runloop")
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run", help="run one loop and show it as it streams")
    one.add_argument("prompt", nargs="?", help="the prompt; read from stdin when absent or -")
    one.add_argument("--url", default=os.environ.get("RUNLOOP_URL"),
                     help="the provider server (default: a demo server, runloop serve run by "
                          "this command: $RUNLOOP_BIN, else runloop on PATH)")
    which = one.add_mutually_exclusive_group()
    which.add_argument("--image", default="demo", metavar="NAME[@DIGEST]",
                       help="the server's catalog image to run, pinned to its "
                            "manifest digest when the server asks for one (default: demo)")
    which.add_argument("--registry-image", metavar="REF",
                       help="a registry image the server pulls (HOST/NAME:TAG or @sha256:...)")
    one.add_argument("--memory", default="1G",
                     help="the run's memory, bytes or K/M/G (default: 1G)")
    one.add_argument("--disk", default="0",
                     help="the run's disk, bytes or K/M/G (default: 0; a container needs "
                          "at least 1M)")
    one.add_argument("--json", action="store_true",
                     help='one JSON object a line: {"chunk":...}, {"error":...}, {"outcome":...}')
    args = parser.parse_args(argv)
    prompt = args.prompt if args.prompt not in (None, "-") else sys.stdin.read()
    token = os.environ.get("RUNLOOP_TOKEN", "")
    demo = None
    if not args.url:
        try:
            demo = _demo.start()
        except RunloopError as error:
            print(f"runloop: {error}", file=sys.stderr)
            return 2
        token = demo.token
    url = args.url or (demo.url if demo else "")
    try:
        return asyncio.run(run(url, token, image_of(args), prompt, args.json))
    except (ValueError, TypeError) as error:
        # A request the client refuses before sending it (a bad size, a
        # digest where none may go): the caller's mistake, in words.
        print(f"runloop: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Timeout as error:
        print(f"runloop: {error}", file=sys.stderr)
        return 8
    except RunloopError as error:
        print(f"runloop: {error}", file=sys.stderr)
        return 2
    finally:
        if demo is not None:
            demo.close()


if __name__ == "__main__":
    sys.exit(main())
