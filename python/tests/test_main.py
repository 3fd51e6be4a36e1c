"""``python -m runloop run``: one loop against the embedded demo server, the
CLI's exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("prompt", "outcome", "code"),
    [
        ("Count the words in this sentence", "finished", 0),
        ("demo:fatal", "finished", 6),
        ("demo:break", "unfinished", 1),
        ("demo:refuse", "no_loop", 3),
    ],
)
def test_python_m_runloop_run_has_its_own_demo(prompt: str, outcome: str, code: int) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runloop", "run", "--json", prompt],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[-1]["outcome"] == outcome
    if outcome == "finished":
        assert all("chunk" in line for line in lines[:-1]) and len(lines) > 5


def test_python_m_runloop_run_without_json_shows_the_text() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runloop", "run", "Count the words in this sentence"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "That is 6 words" in done.stdout
    assert "[finished]" in done.stderr
