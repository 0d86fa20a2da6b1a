#!/usr/bin/env bash
# A user backs a database up, has the backup proven by restoring it (spec.verify), then
# restores it into a new database and counts the rows. Needs the VolumeSnapshot API and a
# VolumeSnapshotClass for the volumes' CSI driver (the sandbox has both); skipped where the
# API is not served. Rows are counted over the database's HTTP port, which the script reaches
# at the pod's address (the sandbox's pods are on loopback; on a real cluster run it from a
# pod, or port-forward).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! kubectl api-resources --api-group=snapshot.storage.k8s.io -o name 2>/dev/null | grep -q volumesnapshots; then
    say "skipped: the VolumeSnapshot API is not served"
    exit 0
fi
ensure_namespace

# sql NAME QUERY: runs QUERY on QuestDB NAME's HTTP port with its own credentials; prints the
# JSON answer.
sql() {
    local ip user password
    ip="$(k get pod "$1-0" -o jsonpath='{.status.podIP}')"
    user="$(k get secret "$1-credentials" -o jsonpath='{.data.QDB_HTTP_USER}' | base64 -d)"
    password="$(k get secret "$1-credentials" -o jsonpath='{.data.QDB_HTTP_PASSWORD}' | base64 -d)"
    curl -fsS -u "$user:$password" -G "http://$ip:9000/exec" --data-urlencode "query=$2"
}

# rows NAME: the row count of table `readings` (empty while it cannot be read).
rows() { sql "$1" "select count() from readings" 2>/dev/null | sed -n 's/.*"dataset":\[\[\([0-9]*\)\]\].*/\1/p'; }

# wait_rows NAME COUNT
wait_rows() {
    local deadline=$((SECONDS + ${TIMEOUT%s}))
    while [ "$SECONDS" -lt "$deadline" ]; do
        [ "$(rows "$1")" = "$2" ] && return 0
        sleep 1
    done
    fail "qdb/$1 holds $(rows "$1") rows in readings, not $2"
}

say "create qdb/e2e-bk with 1000 rows"
questdb_manifest e2e-bk | sed 's/retainOnDelete: true/retainOnDelete: false/' | kubectl apply -f -
wait_ready e2e-bk
sql e2e-bk "create table readings (id long, ts timestamp) timestamp(ts) partition by day wal" >/dev/null ||
    fail "create table"
sql e2e-bk "insert into readings select x, timestamp_sequence('2026-01-01', 1000000L) from long_sequence(1000)" >/dev/null ||
    fail "insert"
wait_rows e2e-bk 1000

say "back it up and prove the backup by restoring it"
kubectl apply -f - <<YAML
apiVersion: crd.questdb.io/v1beta1
kind: QuestDBBackup
metadata: {name: e2e-bk-1, namespace: $NS}
spec: {questdbName: e2e-bk, verify: true, deletionPolicy: Delete}
YAML
wait_jsonpath qdbbackup/e2e-bk-1 '{.status.step}' Succeeded
k wait qdbbackup/e2e-bk-1 --for=condition=Verified --timeout="$TIMEOUT" >/dev/null ||
    fail "the backup was not verified: $(k get qdbbackup e2e-bk-1 -o jsonpath='{.status.conditions}')"
[ "$(k get qdbbackup e2e-bk-1 -o jsonpath='{.status.tables[?(@.name=="readings")].rows}')" = 1000 ] ||
    fail "the backup did not record 1000 rows of readings"
k get qdbbackup e2e-bk-1
k wait qdb/e2e-bk --for=condition=BackupVerified --timeout="$TIMEOUT" >/dev/null ||
    fail "qdb/e2e-bk does not show its verified backup"
wait_jsonpath qdbbackup/e2e-bk-1 '{.status.verification.step}' Done
k get qdb verify-e2e-bk-1 >/dev/null 2>&1 && fail "the throwaway database is still there"

say "restore it into qdb/e2e-restored"
questdb_manifest e2e-restored | sed 's/retainOnDelete: true/retainOnDelete: false, restoreFrom: {backup: e2e-bk-1}/' |
    kubectl apply -f -
wait_ready e2e-restored
k wait qdb/e2e-restored --for=condition=VolumeRestored --timeout="$TIMEOUT" >/dev/null ||
    fail "VolumeRestored is not True"
wait_rows e2e-restored 1000

k delete qdb e2e-restored e2e-bk --wait=true --timeout="$TIMEOUT"
k delete qdbbackup e2e-bk-1 --wait=true --timeout="$TIMEOUT"
say "ok: backup, verify, restore"
