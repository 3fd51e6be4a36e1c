"""The blocking twin: the same loops and endings, and Ctrl-C that interrupts
a wait within 100 ms and stops the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import runloop
from conftest import Server


@pytest.mark.parametrize(
    ("prompt", "kind", "fatal"),
    [
        ("Count the words in this sentence", "finished", False),
        ("demo:fatal", "finished", True),
        ("demo:break", "unfinished", False),
        ("demo:refuse", "no_loop", False),
    ],
)
def test_the_sync_twin_reads_every_ending(server: Server, prompt: str, kind: str, fatal: bool) -> None:
    with runloop.connect_sync(server.url, token=server.token) as client:
        with client.start("demo", memory="64M") as run:
            with run.loop(prompt) as stream:
                events = list(stream)
            assert stream.outcome.kind == kind and stream.outcome.fatal == fatal
            if kind in ("unfinished", "no_loop"):
                assert isinstance(events[-1], runloop.Error)
                assert events[-1].value == stream.outcome.error
            else:
                assert all(isinstance(event, runloop.Chunk) for event in events)
        assert run.ended
        with pytest.raises(runloop.RunEnded):
            run.loop("after the end")
    assert client.closed


def test_sync_errors_are_the_same_exceptions(server: Server) -> None:
    with runloop.connect_sync(server.url, token="wrong") as client:
        with pytest.raises(runloop.ConnectError):
            client.start("demo", memory="64M")
    with runloop.connect_sync(server.url, token=server.token) as client:
        with pytest.raises(runloop.RunRefused):
            client.start("nothing-by-this-name", memory="64M")


def test_ctrl_c_interrupts_a_sync_loop_within_100_ms_and_stops_the_run(fresh_server: Server) -> None:
    script = textwrap.dedent(
        """
        import os, sys, time
        import runloop

        client = runloop.connect_sync(os.environ["URL"], os.environ["TOKEN"])
        run = client.start("demo", memory="64M")
        try:
            with run.loop("demo:pace=1500 a loop that takes its time") as stream:
                for event in stream:
                    print("chunk", flush=True)
        except KeyboardInterrupt:
            print("interrupted", time.monotonic(), run.ended, flush=True)
            run.wait_ended()
            print("ended on the server", flush=True)
        client.close()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        env=dict(os.environ, URL=fresh_server.url, TOKEN=fresh_server.token),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    try:
        # The first chunk comes 1.5 s in; the loop is waiting for the second.
        assert child.stdout.readline().strip() == "chunk"
        time.sleep(0.3)
        # CLOCK_MONOTONIC is one clock for every process of the machine.
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        words = child.stdout.readline().split()
        assert words[0] == "interrupted", words
        took = float(words[1]) - sent
        assert took < 0.1, f"Ctrl-C took {took * 1000:.0f} ms"
        assert words[2] == "True"
        assert child.stdout.readline().strip() == "ended on the server"
        assert child.wait(timeout=10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert fresh_server.metric("runloop_runs_ended_total", 'reason="stop"') == 1
