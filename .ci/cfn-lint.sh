#!/usr/bin/env bash
# cfn-lint (AWS's CloudFormation linter: every resource type, property and intrinsic function
# checked against the published resource specifications) for deploy/aws/'s template, installed
# once into .venv beside moto. Prints the path of the cfn-lint binary.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
VERSION="1.58.0"
BIN="$VENV/bin/cfn-lint"

if [[ ! -x "$BIN" ]] || [[ "$("$BIN" --version 2>/dev/null)" != "cfn-lint $VERSION" ]]; then
    [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet "cfn-lint==$VERSION" >&2
fi
echo "$BIN"
