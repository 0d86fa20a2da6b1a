#!/usr/bin/env bash
# A dedicated node's kubelet that reports NotReady while it renews its Lease (a container
# runtime or CNI restart) is not a dead node: nothing is fenced or evicted. Nor is one cut off
# from the API server whose database still answers. A power blip shorter
# than the failover threshold is the power coming back: the database returns on the same
# instance. Sandbox only: the faults are the sandbox's `sandbox.questdb.io/fault` annotation.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ -z "${E2E_SANDBOX:-}" ]; then say "skipped: the node faults are the sandbox's (E2E_SANDBOX=1)"; exit 0; fi

say "create qdb/e2e-node on a dedicated node (failover after 40 s of silence)"
questdb_manifest e2e-node | sed 's/^spec:$/spec:\
  node: {image: ami-0123456789abcdef0, instanceType: m6i.large, zone: sim-zone-a}\
  failover: {unhealthyAfterSeconds: 40}/' | kubectl apply -f -
wait_ready e2e-node
instance="$(k get qdb e2e-node -o jsonpath='{.status.instanceID}')"
node="$(k get pod e2e-node-0 -o jsonpath='{.spec.nodeName}')"
pod="$(k get pod e2e-node-0 -o jsonpath='{.metadata.uid}')"
[ -n "$instance" ] && [ -n "$node" ] || fail "no dedicated node"

# same_database SECONDS: for that long, the database keeps its instance and its pod and no
# failover starts (a watch for something that must not happen has to last a while).
same_database() {
    local until=$((SECONDS + $1))
    while [ "$SECONDS" -lt "$until" ]; do
        [ "$(k get qdb e2e-node -o jsonpath='{.status.instanceID}')" = "$instance" ] ||
            fail "the database left instance $instance"
        [ -z "$(k get qdb e2e-node -o jsonpath='{.status.failover.phase}')" ] ||
            fail "a failover started: $(k get qdb e2e-node -o jsonpath='{.status.failover}')"
        [ "$(k get pod e2e-node-0 -o jsonpath='{.metadata.uid}' 2>/dev/null)" = "$pod" ] ||
            fail "the database pod was replaced"
        sleep 2
    done
}

say "node $node NotReady while its Lease renews, past the threshold: nothing happens"
kubectl annotate node "$node" sandbox.questdb.io/fault=not-ready --overwrite >/dev/null
wait_jsonpath qdb/e2e-node '{.status.nodeReady}' false
same_database 50
kubectl annotate node "$node" sandbox.questdb.io/fault- >/dev/null
wait_jsonpath qdb/e2e-node '{.status.nodeReady}' true
wait_ready e2e-node

# answers: the database answers its HTTP port with its own credentials (a real QuestDB; the
# sandbox's fake databases answer nothing).
answers() {
    local ip user password
    ip="$(k get pod e2e-node-0 -o jsonpath='{.status.podIP}')"
    user="$(k get secret e2e-node-credentials -o jsonpath='{.data.QDB_HTTP_USER}' | base64 -d)"
    password="$(k get secret e2e-node-credentials -o jsonpath='{.data.QDB_HTTP_PASSWORD}' | base64 -d)"
    curl -fsS -m 3 -u "$user:$password" -G "http://$ip:9000/exec" --data-urlencode "query=select 1" >/dev/null 2>&1
}

if answers; then
    say "node $node's kubelet cut off from the API server past the threshold, its database answering: not fenced"
    kubectl annotate node "$node" sandbox.questdb.io/fault=kubelet-cut-off --overwrite >/dev/null
    wait_jsonpath qdb/e2e-node '{.status.conditions[?(@.type=="Failover")].reason}' FailoverSuppressed
    message="$(k get qdb e2e-node -o jsonpath='{.status.conditions[?(@.type=="Failover")].message}')"
    case "$message" in DatabaseAnswers*) ;; *) fail "held back for another reason: $message" ;; esac
    answers || fail "the database stopped answering"
    same_database 10
    kubectl annotate node "$node" sandbox.questdb.io/fault- >/dev/null
    wait_jsonpath qdb/e2e-node '{.status.nodeReady}' true
    wait_ready e2e-node
else
    say "skipped the kubelet cut off: the sandbox's databases are fake (they answer nothing)"
fi

say "a power blip on $node, shorter than the threshold: the database comes back where it was"
kubectl annotate node "$node" sandbox.questdb.io/fault=power-off --overwrite >/dev/null
wait_jsonpath qdb/e2e-node '{.status.nodeReady}' false
kubectl annotate node "$node" sandbox.questdb.io/fault- >/dev/null
wait_jsonpath qdb/e2e-node '{.status.nodeReady}' true
wait_ready e2e-node
same_database 4
k get qdb e2e-node

k delete qdb e2e-node --wait=true --timeout="$TIMEOUT"
k delete pvc e2e-node-data --wait=false
say "ok: node faults"
