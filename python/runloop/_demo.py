"""``python -m runloop run``'s demo server: the ``runloop`` command's ``serve``,
run as a child process on a loopback port with a token of its own.

The server is not compiled into the package: a caller's wheel builds the
client only (a few minutes), and most callers talk to a server that runs
elsewhere. The demo takes the ``runloop`` command from ``RUNLOOP_BIN``,
else ``PATH``, else cargo's ``bin`` directory; when there is none it says
how to install it (``cargo install``, once, with cargo's progress on the
terminal) rather than start a build of its own: a ``run`` that silently
compiled a server for minutes is not what anyone asks for.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from . import _native
from ._errors import RunloopError

#: The environment variable that names the ``runloop`` command to run.
ENV = "RUNLOOP_BIN"

#: How long the demo server has to stop before it is killed, seconds.
STOP_GRACE = 10.0


class NoServer(RunloopError):
    """There is no ``runloop`` command to run a demo server with."""


def find() -> Optional[str]:
    """The ``runloop`` command: ``$RUNLOOP_BIN``, else on ``PATH``, else in cargo's ``bin``."""
    given = os.environ.get(ENV)
    if given:
        return given
    found = shutil.which("runloop")
    if found:
        return found
    cargo_home = Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo")
    installed = cargo_home / "bin" / "runloop"
    return str(installed) if os.access(installed, os.X_OK) else None


def how_to_install() -> str:
    """The command that installs ``runloop``, from the checkout this package was built from."""
    cli = Path(_native.CHECKOUT).resolve() / "crates" / "runloop-cli"
    if (cli / "Cargo.toml").is_file():
        return f"cargo install --locked --path {cli}"
    return "cargo install --locked --path crates/runloop-cli   # in a checkout of runloop"


def missing() -> NoServer:
    return NoServer(
        "without --url, python -m runloop run serves the demo agent with the runloop "
        f"command (runloop serve), and there is none: {ENV} is not set, and there is no "
        "runloop on PATH or in cargo's bin directory. Install it once (a release build: "
        "several minutes on two cores, cargo shows its progress):\n"
        f"    {how_to_install()}\n"
        f"or name one with {ENV}=PATH, or give --url of a running server."
    )


class DemoServer:
    """``runloop serve`` on ``127.0.0.1``, a free port, and a fresh token."""

    def __init__(self, binary: str) -> None:
        self.token = secrets.token_urlsafe(24)
        env = dict(os.environ, RUNLOOP_TOKEN=self.token)
        env.setdefault("RUST_LOG", "warn")
        # What the server says goes to a file, shown if it does not start;
        # its first line of stdout is its URL.
        self._log = tempfile.TemporaryFile()
        try:
            self._process = subprocess.Popen(
                [binary, "serve", "--listen", "127.0.0.1:0"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=self._log,
                text=True,
            )
        except OSError as error:
            self._log.close()
            if os.environ.get(ENV):
                raise NoServer(f"cannot run {ENV}={binary}: {error}") from error
            raise missing() from error
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if not line.startswith(("ws://", "wss://")):
            self.close()
            raise RunloopError(f"{binary} serve did not start: {self._said() or line or 'no word'}")
        self.url = line

    def _said(self) -> str:
        try:
            self._log.seek(0)
            return self._log.read().decode(errors="replace").strip()
        except ValueError:  # closed
            return ""

    def close(self) -> None:
        """Stops the server (SIGTERM, then SIGKILL after ``STOP_GRACE``)."""
        process = self._process
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
        self._log.close()


def start() -> DemoServer:
    """A demo server, or NoServer saying how to get the ``runloop`` command."""
    binary = find()
    if binary is None:
        raise missing()
    return DemoServer(binary)
