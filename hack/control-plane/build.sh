#!/usr/bin/env bash
# Builds the real control plane the tests run against (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler) from the Go modules pinned in go.mod, into a cache
# directory keyed by those versions. Does nothing when the binaries are already there.
# Prints the directory holding the binaries on its last line.
#   QDB_CONTROL_PLANE_CACHE  cache root (default ~/.cache/qdb-control-plane)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
k8s_version="$(awk '$1=="k8s.io/kubernetes" {print $2}' "$here/go.mod" | head -1)"
etcd_version="$(awk '$1=="go.etcd.io/etcd/server/v3" && $2 ~ /^v/ {print $2}' "$here/go.mod" | head -1)"
# go.sum and the kube-controller-manager wrapper (a test flag for the attach-detach timer).
key="kubernetes-${k8s_version}-etcd-${etcd_version}-$(cat "$here/go.sum" "$here/kube-controller-manager/main.go" | sha256sum | cut -c1-12)"
root="${QDB_CONTROL_PLANE_CACHE:-$HOME/.cache/qdb-control-plane}"
out="$root/$key"
bins=(etcd kube-apiserver kube-controller-manager kube-scheduler)

complete=1
for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || complete=0; done
if [[ $complete == 1 ]]; then
  echo "$out"
  exit 0
fi

# --background: started by the sandbox's cargo build script while Rust compiles; nothing to
# print to (its output goes nowhere), and if another build holds the lock there is nothing to do.
background=0
[[ "${1:-}" == "--background" ]] && background=1

# One build at a time (two test binaries, or CI and a sandbox, may start together).
mkdir -p "$root"
exec 9>"$root/.lock-$key"
log="$root/build-$key.log"
if ! flock -n 9; then
  [[ $background == 1 ]] && exit 0
  # Another build is under way (the one cargo started while compiling the sandbox, say): wait
  # for it, with the same progress lines it would print.
  echo "control plane: a build is already under way (log: $log); waiting for it" >&2
  waited=$(date +%s)
  until flock -w 30 9; do
    total=$(cat "$out".tmp.*/.packages 2>/dev/null | head -1 || true)
    done_count=$(grep -c -v -e '^go: ' -e '^#' "$log" 2>/dev/null || true)
    echo "control plane: building, ${done_count:-0} of ${total:-?} packages compiled, waited $(( $(date +%s) - waited ))s" >&2
  done
fi
complete=1
for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || complete=0; done
if [[ $complete == 1 ]]; then
  echo "$out"
  exit 0
fi

if ! command -v go >/dev/null; then
  echo "control plane: Go is not installed; cannot build kube-apiserver ${k8s_version} (install Go 1.26+)" >&2
  exit 1
fi

major="${k8s_version#v}"; major="${major%%.*}"
minor="${k8s_version#v*.}"; minor="${minor%%.*}"
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
# The same values for the older client-go copy the binaries also link.
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version"

tmp="$out.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
echo "control plane: building etcd ${etcd_version} and Kubernetes ${k8s_version} into $out (first time only; about 10-25 min on 2 cores; log: $log)" >&2
started=$(date +%s)
cmds=(k8s.io/kubernetes/cmd/kube-apiserver ./kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler)
(
  cd "$here"
  export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod"
  # How many packages there are to compile, for the progress lines (-v prints each one built).
  { go list -deps "${cmds[@]}" go.etcd.io/etcd/server/v3 | wc -l; } >"$tmp/.packages" 2>/dev/null || true
  go build -v -trimpath -ldflags "$ldflags" -o "$tmp/" "${cmds[@]}"
  go build -v -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
) >"$log" 2>&1 &
build=$!
# A line at least every 30 s: a cold build is silent for many minutes otherwise.
while kill -0 "$build" 2>/dev/null; do
  for _ in $(seq 30); do
    kill -0 "$build" 2>/dev/null || break
    sleep 1
  done
  kill -0 "$build" 2>/dev/null || break
  total=$(cat "$tmp/.packages" 2>/dev/null || true)
  done_count=$(grep -c -v -e '^go: ' -e '^#' "$log" 2>/dev/null || true)
  echo "control plane: building, ${done_count:-0} of ${total:-?} packages compiled, $(( $(date +%s) - started ))s elapsed" >&2
done
wait "$build" || { echo "control plane: go build failed; see $log" >&2; tail -20 "$log" >&2; exit 1; }
mkdir -p "$out"
for b in "${bins[@]}"; do mv "$tmp/$b" "$out/$b"; done
echo "control plane: built in $(( $(date +%s) - started ))s: $(cd "$out" && du -sh "${bins[@]}" | tr '\n\t' '  ')" >&2
echo "$out"
