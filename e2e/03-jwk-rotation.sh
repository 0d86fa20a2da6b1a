#!/usr/bin/env bash
# A client's JWK in an annotated Secret becomes the ILP auth file; rotating it restarts the pod
# without any edit to the QuestDB; a broken Secret withholds only its own key.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# Public test keys: RFC 7515 A.3 and RFC 7517 A.1 (P-256). The `d` of the first is the RFC's.
KEY1='{"kty":"EC","crv":"P-256","kid":"ingest-1","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0","d":"jpsQnnGQmL-YBIffH1136cspYG6-0iY7X1fCE9-E9LI"}'
KEY2='{"kty":"EC","crv":"P-256","kid":"ingest-2","x":"MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4","y":"4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM"}'
auth() { k get configmap e2e-db-ilp-auth -o jsonpath='{.data.auth\.txt}'; }

say "annotated Secret with key ingest-1"
before="$(k get pod e2e-db-0 -o jsonpath='{.metadata.uid}')"
secret_json e2e-db-ilp-key "$KEY1"
k annotate secret e2e-db-ilp-key crd.questdb.io/name=e2e-db --overwrite
wait_jsonpath qdb/e2e-db '{.status.conditions[?(@.type=="IlpAuthReady")].reason}' KeysLoaded
auth | grep -q '^ingest-1 ec-p-256-sha256 f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU ' || fail "auth.txt lacks ingest-1"
wait_changed pod/e2e-db-0 '{.metadata.uid}' "$before"
wait_ready e2e-db

say "rotate to ingest-2 (no edit to the QuestDB)"
before="$(k get pod e2e-db-0 -o jsonpath='{.metadata.uid}')"
secret_json e2e-db-ilp-key "$KEY2"
wait_changed pod/e2e-db-0 '{.metadata.uid}' "$before"
auth | grep -q '^ingest-2 ' || fail "auth.txt lacks ingest-2"
auth | grep -q '^ingest-1 ' && fail "auth.txt still has ingest-1"

say "a broken Secret withholds only its own key"
secret_json e2e-db-broken '{"kty":"EC","crv":"P-384","kid":"x","x":"a","y":"b"}'
k annotate secret e2e-db-broken crd.questdb.io/name=e2e-db
wait_jsonpath qdb/e2e-db '{.status.conditions[?(@.type=="IlpAuthReady")].reason}' InvalidSecret
auth | grep -q '^ingest-2 ' || fail "a broken Secret took the other key with it"
k get configmap -o yaml | grep -q 'jpsQnnGQmL' && fail "a private key leaked into a ConfigMap"
k delete secret e2e-db-broken
wait_jsonpath qdb/e2e-db '{.status.conditions[?(@.type=="IlpAuthReady")].reason}' KeysLoaded
say "ok: JWK rotation"
