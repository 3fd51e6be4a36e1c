"""Streams one loop of the demo agent, printing the assistant's text as it comes.

    RUNLOOP_URL=ws://127.0.0.1:7878 RUNLOOP_TOKEN=... python examples/stream.py "a prompt"

Exits 0 when the loop finished, 1 when it ended any other way.
"""

from __future__ import annotations

import asyncio
import os
import sys

import runloop


async def main(prompt: str) -> int:
    url = os.environ.get("RUNLOOP_URL", "ws://127.0.0.1:7878")
    token = os.environ.get("RUNLOOP_TOKEN", "")
    try:
        async with runloop.connect(url, token=token, connect_timeout=5) as client:
            run = await client.start("demo", memory="256M")
            async with run.loop(prompt) as stream:
                async for event in stream:
                    if isinstance(event, runloop.Chunk):
                        if event.kind == "assistant_text_content":
                            print(event.text, end="", flush=True)
                        elif event.kind == "assistant_tool_call" and event.name:
                            print(f"\n[tool call {event.name} {event.arguments or ''}]", flush=True)
                    else:
                        print(f"\n[error] {event.value}", file=sys.stderr)
            await run.stop()
    except runloop.RunRefused as refused:
        print(f"refused: {refused.error}", file=sys.stderr)
        return 1
    except runloop.RunloopError as error:
        print(f"runloop: {error}", file=sys.stderr)
        return 1
    outcome = stream.outcome
    print(f"\n[{outcome.kind}{' (fatal)' if outcome.fatal else ''}]")
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(" ".join(sys.argv[1:]) or "Count the words in this sentence")))
