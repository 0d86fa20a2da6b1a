#!/usr/bin/env bash
# Editing server.conf properties rolls the pod and the database comes back Ready.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
before="$(k get pod e2e-db-0 -o jsonpath='{.metadata.uid}')"
say "edit spec.config.server"
k patch qdb e2e-db --type merge -p '{"spec":{"config":{"server":{"cairo.commit.lag":"5000"}}}}'
wait_changed pod/e2e-db-0 '{.metadata.uid}' "$before"
k get configmap e2e-db-config -o jsonpath='{.data.server\.conf}' | grep -q 'cairo.commit.lag=5000' ||
    fail "server.conf not updated"
wait_ready e2e-db
say "ok: config change rolled the pod"
