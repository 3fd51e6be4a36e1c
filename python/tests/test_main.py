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


def run_main(*args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [sys.executable, "-m", "runloop", "run", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_bad_size_is_the_callers_mistake_in_words_exit_2() -> None:
    done = run_main("--memory", "lots", "hello")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("runloop: memory: 'lots' is not a byte count"), done.stderr
    assert "Traceback" not in done.stderr


def test_a_registry_image_reaches_the_server_and_its_refusal_is_exit_7() -> None:
    # The embedded demo server names no registry: the request goes out as
    # a registry image, and the server's refusal says why.
    done = run_main("--registry-image", "127.0.0.1:5000/agents/echo:1", "--disk", "8M", "hi")
    assert done.returncode == 7, done.stderr
    assert "registr" in done.stderr, done.stderr


def test_a_pinned_image_is_sent_with_its_digest() -> None:
    # NAME@DIGEST is split into the request's name and digest (a name with
    # a digest in it is refused by the client). The demo entry pins no
    # digest, so the server serves it whatever digest is asked for.
    done = run_main("--json", "--image", "demo@sha256:" + "0" * 64, "hi")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"outcome": "finished"}
