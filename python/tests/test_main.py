"""``python -m runloop run``: one loop against its demo server (``runloop
serve`` run as a child), the CLI's exit codes, and the word on how to get
the ``runloop`` command when there is none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from conftest import runloop_binary


def main_env(**extra: str) -> dict[str, str]:
    """The environment of ``python -m runloop``: the workspace's ``runloop`` as RUNLOOP_BIN."""
    return dict(os.environ, RUNLOOP_BIN=str(runloop_binary()), **extra)


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
        env=main_env(),
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
        env=main_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "That is 6 words" in done.stdout
    assert "[finished]" in done.stderr


def run_main(*args: str, env: Optional[dict[str, str]] = None) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [sys.executable, "-m", "runloop", "run", *args],
        env=main_env() if env is None else env,
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


def test_without_a_runloop_command_it_says_how_to_install_one(tmp_path: Path) -> None:
    # No RUNLOOP_BIN, nothing named runloop on PATH, an empty cargo home.
    env = {k: v for k, v in os.environ.items() if k != "RUNLOOP_BIN"}
    env["PATH"] = str(Path(sys.executable).parent)
    env["CARGO_HOME"] = str(tmp_path)
    done = run_main("hi", env=env)
    assert done.returncode == 2, done.stderr
    root = Path(__file__).resolve().parents[2]
    assert f"cargo install --locked --path {root / 'crates' / 'runloop-cli'}" in done.stderr
    assert "RUNLOOP_BIN" in done.stderr and "--url" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_runloop_bin_that_is_not_there_is_named(tmp_path: Path) -> None:
    done = run_main("hi", env=dict(os.environ, RUNLOOP_BIN=str(tmp_path / "nothing")))
    assert done.returncode == 2, done.stderr
    assert f"cannot run RUNLOOP_BIN={tmp_path / 'nothing'}" in done.stderr
    assert "Traceback" not in done.stderr
