# Shared helpers for the e2e scenarios. Only kubectl is used, so the same scripts run against the
# sandbox (`KUBECONFIG=sandbox.kubeconfig`) and a real cluster (kind, EKS).
set -euo pipefail

NS="${E2E_NAMESPACE:-e2e}"
TIMEOUT="${E2E_TIMEOUT:-180s}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

k() { kubectl -n "$NS" "$@"; }
say() { printf '\n[%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { echo "FAIL: $*" >&2; k get qdb -o wide >&2 || true; exit 1; }

# The everyday commands a user types (`kubectl create namespace`, `kubectl create secret
# generic`), so the scenarios also prove they work against the cluster.
ensure_namespace() {
    kubectl get namespace "$NS" >/dev/null 2>&1 || kubectl create namespace "$NS" >/dev/null
}

# secret_json NAME JSON: a Secret holding a JWK in auth.json, created or replaced.
secret_json() {
    if k get secret "$1" >/dev/null 2>&1; then
        k create secret generic "$1" --from-literal=auth.json="$2" --dry-run=client -o yaml |
            kubectl apply -f - >/dev/null
    else
        k create secret generic "$1" --from-literal=auth.json="$2" >/dev/null
    fi
}

# wait_ready NAME: the QuestDB's Ready condition turns True.
wait_ready() {
    k wait "qdb/$1" --for=condition=Ready --timeout="$TIMEOUT" >/dev/null ||
        fail "qdb/$1 did not become Ready"
}

# wait_jsonpath RESOURCE JSONPATH VALUE
wait_jsonpath() {
    k wait "$1" --for="jsonpath=$2=$3" --timeout="$TIMEOUT" >/dev/null ||
        fail "$1 never had $2=$3 (now: $(k get "$1" -o "jsonpath=$2" 2>/dev/null))"
}

# wait_changed RESOURCE JSONPATH OLD: waits until the value differs from OLD.
wait_changed() {
    local deadline=$((SECONDS + ${TIMEOUT%s}))
    while [ "$SECONDS" -lt "$deadline" ]; do
        local now
        now="$(k get "$1" -o "jsonpath=$2" 2>/dev/null || true)"
        if [ -n "$now" ] && [ "$now" != "$3" ]; then return 0; fi
        sleep 1
    done
    fail "$1 $2 stayed $3"
}

questdb_manifest() { # NAME
    cat <<YAML
apiVersion: crd.questdb.io/v1beta1
kind: QuestDB
metadata:
  name: $1
  namespace: $NS
spec:
  image: questdb/questdb:9.2.0
  volume: {size: 10Gi, retainOnDelete: true}
  config:
    server:
      cairo.commit.lag: "1000"
YAML
}
