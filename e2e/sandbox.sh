#!/usr/bin/env bash
# Starts the sandbox, runs every scenario against it, stops it. Used by the integration test
# `e2e_scenarios_pass_against_the_sandbox` and runnable by hand:
#   bash e2e/sandbox.sh [path/to/questdb-sandbox]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-${QUESTDB_OPERATOR_BIN:-}}"
if [ -z "$BIN" ]; then
    cargo build --quiet -p questdb-sandbox --manifest-path "$ROOT/Cargo.toml"
    BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/questdb-sandbox"
fi
WORK="$(mktemp -d)"
export KUBECONFIG="$WORK/sandbox.kubeconfig"
"$BIN" --kubeconfig "$KUBECONFIG" --example /nonexistent \
    --metrics-bind-address 0 --health-probe-bind-address 0 >"$WORK/sandbox.log" 2>&1 &
PID=$!
trap 'kill -INT $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 1 600); do
    [ -s "$KUBECONFIG" ] && kubectl get --raw /readyz >/dev/null 2>&1 && break
    kill -0 $PID 2>/dev/null || { cat "$WORK/sandbox.log"; exit 1; }
    sleep 0.2
done
# The sandbox installs the CRD a moment after the apiserver answers /readyz. `kubectl wait` cannot
# wait for it: it fails at once on an object that does not exist yet, and on a CRD just created,
# whose `status.conditions` is null until the apiserver's establishing controller fills it in
# (seen in CI: "accessor error: <nil> is of the type <nil>"). Poll the condition instead.
ESTABLISHED='{.status.conditions[?(@.type=="Established")].status}'
for _ in $(seq 1 600); do
    [ "$(kubectl get crd/questdbs.crd.questdb.io -o "jsonpath=$ESTABLISHED" 2>/dev/null)" = True ] && break
    kill -0 $PID 2>/dev/null || { cat "$WORK/sandbox.log"; exit 1; }
    sleep 0.2
done
[ "$(kubectl get crd/questdbs.crd.questdb.io -o "jsonpath=$ESTABLISHED")" = True ] ||
    { echo "the QuestDB CRD was never Established"; tail -50 "$WORK/sandbox.log"; exit 1; }
E2E_SANDBOX=1 bash "$ROOT/e2e/run.sh" || { echo "--- sandbox log (tail)"; tail -50 "$WORK/sandbox.log"; exit 1; }
