#!/usr/bin/env bash
# Runs every scenario in order against $KUBECONFIG (the sandbox's or a real cluster's).
#   KUBECONFIG=sandbox.kubeconfig bash e2e/run.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for s in "$HERE"/[0-9][0-9]-*.sh; do
    bash "$s"
done
echo "e2e: all scenarios passed"
