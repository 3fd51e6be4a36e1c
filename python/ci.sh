#!/usr/bin/env bash
# The Python package's gate, run by .ci/run after the Rust suite: a fresh
# virtual environment, the package built into it from this tree (a debug
# build in the workspace's target/, warm from the Rust suite), then pytest
# against a real `runloop serve` and mypy --strict on the package, its
# tests, its examples and the bench. Needs only python3 (with venv) and the
# Rust toolchain; maturin, pytest, pytest-asyncio, mypy and websockets come
# from PyPI. Exits non-zero on the first failure.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
venv="${RUNLOOP_PYTHON_VENV:-$CARGO_TARGET_DIR/python-venv}"

python3 -m venv "$venv"
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
python -m pip install --quiet --disable-pip-version-check \
    "maturin>=1.7,<2" "pytest>=8" "pytest-asyncio>=0.23" "mypy>=1.10" "websockets>=13"

# The tests run the workspace's binary; built already by the Rust suite.
cargo build --quiet --locked -p runloop-cli
cd "$here"
maturin develop --quiet --locked
python -m pytest -q tests
mypy runloop tests examples bench.py
