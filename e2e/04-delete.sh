#!/usr/bin/env bash
# Deleting the QuestDB removes the database but keeps its data (retainOnDelete: true).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pvc_uid="$(k get pvc e2e-db-data -o jsonpath='{.metadata.uid}')"
say "delete qdb/e2e-db"
k delete qdb e2e-db --wait=true --timeout="$TIMEOUT"
k wait statefulset/e2e-db --for=delete --timeout="$TIMEOUT" >/dev/null 2>&1 || true
k get statefulset e2e-db >/dev/null 2>&1 && fail "StatefulSet still there"
[ "$(k get pvc e2e-db-data -o jsonpath='{.metadata.uid}')" = "$pvc_uid" ] || fail "the PVC was not kept"
say "recreate: the new QuestDB adopts the data"
questdb_manifest e2e-db | kubectl apply -f -
wait_ready e2e-db
[ "$(k get pvc e2e-db-data -o jsonpath='{.metadata.uid}')" = "$pvc_uid" ] || fail "a new PVC was made"
k delete qdb e2e-db --wait=true --timeout="$TIMEOUT"
k delete pvc e2e-db-data --wait=false
k delete secret e2e-db-ilp-key --ignore-not-found
say "ok: delete keeps data"
