"""Fixtures: a real ``runloop serve`` (the workspace's binary) on a free loopback port.

The binary is $RUNLOOP_BIN, else target/debug/runloop of the workspace (or
of $CARGO_TARGET_DIR), built with ``cargo build -p runloop-cli`` when it is
missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "python-tests-token"


def runloop_binary() -> Path:
    """The ``runloop`` binary the tests run, built if need be."""
    given = os.environ.get("RUNLOOP_BIN")
    if given:
        return Path(given)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    binary = target / "debug" / "runloop"
    if not binary.exists():
        subprocess.run(["cargo", "build", "-p", "runloop-cli"], cwd=ROOT, check=True)
    return binary


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Server:
    """A ``runloop serve`` child process; its URL is the first line it prints."""

    def __init__(
        self,
        args: Sequence[str] = (),
        token: Optional[str] = TOKEN,
        admin: bool = False,
    ) -> None:
        env = dict(os.environ, RUST_LOG="warn")
        env.pop("RUNLOOP_TOKEN", None)
        if token is not None:
            env["RUNLOOP_TOKEN"] = token
        self.admin: Optional[str] = None
        command = [str(runloop_binary()), "serve", "--listen", "127.0.0.1:0", *args]
        if admin:
            port = free_port()
            command += ["--admin", f"127.0.0.1:{port}"]
            self.admin = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=sys.stderr, text=True
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if not line.startswith(("ws://", "wss://")):
            self.process.kill()
            raise RuntimeError(f"runloop serve did not start: {line!r}")
        self.url = line
        self.token = token or ""

    def metric(self, name: str, labels: str = "") -> float:
        """One figure of the admin listener's /metrics (0 when absent)."""
        assert self.admin is not None, "started without admin=True"
        deadline = time.monotonic() + 5
        while True:
            try:
                with urllib.request.urlopen(self.admin + "/metrics", timeout=2) as answer:
                    text = answer.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        wanted = name + (f"{{{labels}}}" if labels else "")
        for line in text.splitlines():
            if line.startswith(wanted + " "):
                return float(line.split()[-1])
        return 0.0

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """One server for the session, its run limits raised for 200 runs at once.

    Its one token is a tenant, which holds half of --max-runs at most (the
    fair share): 800 leaves it the 400 of --max-runs-per-identity.
    """
    started = Server(
        [
            "--max-runs", "800",
            "--max-runs-per-identity", "400",
            "--max-loops-per-identity", "400",
            "--max-scopes", "400",
            "--memory-budget", "16G",
        ]
    )
    yield started
    started.stop()


@pytest.fixture
def fresh_server() -> Iterator[Server]:
    """A server of the test's own, with an admin listener for its figures."""
    started = Server(admin=True)
    yield started
    started.stop()


def require(tool: str, package: str) -> None:
    """Skips (or, with RUNLOOP_REQUIRE_SYSTEM=1, fails) when `tool` is missing."""
    if shutil.which(tool) is None:
        if os.environ.get("RUNLOOP_REQUIRE_SYSTEM") == "1":
            pytest.fail(f"needs {package} ({tool})")
        print(f"skipped: needs {package}")
        pytest.skip(f"needs {package}")
