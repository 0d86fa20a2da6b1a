#!/usr/bin/env bash
# A provisioner creates a QuestDB and gets a running database with every child.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_namespace
say "create qdb/e2e-db"
questdb_manifest e2e-db | kubectl apply -f -
wait_ready e2e-db
k rollout status statefulset/e2e-db --timeout="$TIMEOUT" >/dev/null || fail "rollout status never completed"
for obj in statefulset/e2e-db service/e2e-db service/e2e-db-headless configmap/e2e-db-config pvc/e2e-db-data; do
    k get "$obj" >/dev/null || fail "$obj missing"
done
[ "$(k get qdb e2e-db -o jsonpath='{.status.phase}')" = Running ] || fail "phase is not Running"
[ "$(k get qdb e2e-db -o jsonpath='{.status.version}')" = 9.2.0 ] || fail "version is not 9.2.0"
k get qdb e2e-db

say "a hand-scaled StatefulSet is put back"
k scale statefulset/e2e-db --replicas=0 >/dev/null
wait_jsonpath statefulset/e2e-db '{.spec.replicas}' 1
wait_ready e2e-db
say "ok: created"
