"""The same loop with the blocking API, and its transcript at the end.

    RUNLOOP_URL=ws://127.0.0.1:7878 RUNLOOP_TOKEN=... python examples/sync.py "a prompt"
"""

from __future__ import annotations

import os
import sys

import runloop


def main(prompt: str) -> int:
    url = os.environ.get("RUNLOOP_URL", "ws://127.0.0.1:7878")
    with runloop.connect_sync(url, token=os.environ.get("RUNLOOP_TOKEN", "")) as client:
        with client.start("demo", memory="256M") as run:
            with run.loop(prompt) as stream:
                for event in stream:
                    if isinstance(event, runloop.Error):
                        print(f"error: {event.json}", file=sys.stderr)
            for chunk in stream.transcript():
                print(chunk.json)
    outcome = stream.outcome
    print(outcome)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main(" ".join(sys.argv[1:]) or "Count the words in this sentence"))
