"""What happens around a loop's process: os.fork(), an event loop that
closes under an open stream, and the interpreter's exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import runloop
from conftest import Server


def python(script: str, url: str, token: str) -> subprocess.CompletedProcess[str]:
    """Runs `script` in a fresh interpreter with URL and TOKEN set."""
    return subprocess.run(
        [sys.executable, "-X", "dev", "-c", textwrap.dedent(script)],
        env=dict(os.environ, URL=url, TOKEN=token, PYTHONWARNINGS="default"),
        capture_output=True,
        text=True,
        timeout=60,
    )


# Forking a process with threads is the point (the runtime's are there);
# Python 3.12+ warns about it.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_client_used_after_fork_raises_and_a_new_one_works(server: Server) -> None:
    client = runloop.connect_sync(server.url, server.token)
    run = client.start("demo", memory="64M")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report in one line, leave without cleanup
        answer = []
        try:
            client.start("demo", memory="64M")
            answer.append("start: no error")
        except runloop.UsedAfterFork as error:
            answer.append("start: UsedAfterFork" if "os.fork()" in str(error) else f"start: {error}")
        try:
            list(run.loop("after the fork"))
            answer.append("loop: no error")
        except runloop.UsedAfterFork:
            answer.append("loop: UsedAfterFork")
        try:
            with runloop.connect_sync(server.url, server.token) as fresh:
                with fresh.start("demo", memory="64M") as own:
                    with own.loop("in the child") as stream:
                        for _ in stream:
                            pass
                    answer.append(f"fresh: {stream.outcome.kind}")
        except BaseException as error:  # noqa: BLE001 - reported to the parent
            answer.append(f"fresh: {error!r}")
        os.write(write, "; ".join(answer).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        said = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert said == "start: UsedAfterFork; loop: UsedAfterFork; fresh: finished"
    # The parent's connection is untouched by the child.
    with run.loop("in the parent") as stream:
        for _ in stream:
            pass
    assert stream.outcome.kind == "finished"
    run.stop()
    client.close()


def test_an_event_loop_closed_under_an_open_stream_prints_nothing(server: Server) -> None:
    done = python(
        """
        import asyncio, gc, os, sys, time
        import runloop

        unraisable = []
        sys.unraisablehook = unraisable.append

        async def begin():
            client = await runloop.connect(os.environ["URL"], os.environ["TOKEN"])
            run = await client.start("demo", memory="64M")
            stream = run.loop("demo:pace=50 Count the words in this sentence")
            first = await stream.__anext__()
            # A task left waiting for the next batch when the loop closes.
            waiting = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0)
            return client, run, stream, waiting

        loop = asyncio.new_event_loop()
        held = loop.run_until_complete(begin())
        loop.close()
        # The chunks keep coming for the closed loop's future.
        time.sleep(1.5)
        del held
        gc.collect()
        time.sleep(0.2)
        print("unraisable:", len(unraisable))
        """,
        server.url,
        server.token,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "unraisable: 0"
    # asyncio's own note about the task it was never allowed to finish may
    # be there; no traceback, no ignored exception, nothing of the package's.
    for sign in ("Traceback", "Exception ignored", "Event loop is closed", "panicked"):
        assert sign not in done.stderr, done.stderr


def test_the_interpreter_exits_cleanly_with_runs_and_loops_open(server: Server) -> None:
    done = python(
        """
        import asyncio, os
        import runloop

        async def main():
            client = await runloop.connect(os.environ["URL"], os.environ["TOKEN"])
            runs = [await client.start("demo", memory="16M") for _ in range(20)]
            streams = [run.loop("demo:pace=20 hello there") for run in runs]
            for stream in streams:
                await stream.__anext__()
            return client, runs, streams

        held = asyncio.run(main())
        print("leaving")
        """,
        server.url,
        server.token,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "leaving"
    assert done.stderr.strip() == ""
