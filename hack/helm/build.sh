#!/usr/bin/env bash
# Builds the real `helm` that lints and renders charts/questdb-operator in the tests
# (tests/helm_chart.rs), from the Go module pinned in go.mod, into a cache directory keyed by that
# version. Does nothing when the binary is already there. Prints the binary's path on its last
# line.
#   QDB_HELM_CACHE  cache root (default ~/.cache/qdb-helm)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod=helm.sh/helm/v3
version="$(awk -v m="$mod" '$1==m && $2 ~ /^v/ {print $2}' "$here/go.mod" | head -1)"
[[ -n "$version" ]] || { echo "helm: no version of $mod in $here/go.mod" >&2; exit 1; }
key="helm-${version}-$(sha256sum "$here/go.sum" | cut -c1-12)"
root="${QDB_HELM_CACHE:-$HOME/.cache/qdb-helm}"
out="$root/$key"
bin="$out/helm"

if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi

# One build at a time (two test binaries, or CI and a developer, may start together).
mkdir -p "$root"
exec 9>"$root/.lock-$key"
log="$root/build-$key.log"
if ! flock -n 9; then
  echo "helm: a build is already under way (log: $log); waiting for it" >&2
  waited=$(date +%s)
  until flock -w 30 9; do
    total=$(cat "$out".tmp.*/.packages 2>/dev/null | head -1 || true)
    done_count=$(grep -c -v -e '^go: ' -e '^#' "$log" 2>/dev/null || true)
    echo "helm: building, ${done_count:-0} of ${total:-?} packages compiled, waited $(( $(date +%s) - waited ))s" >&2
  done
fi
if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi

if ! command -v go >/dev/null; then
  echo "helm: Go is not installed; cannot build helm ${version} (install Go 1.26+, or set QDB_HELM_BIN to a helm binary)" >&2
  exit 1
fi

tmp="$out.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
echo "helm: building ${mod}/cmd/helm ${version} into $out (first time only; about 2-6 min on 2 cores; log: $log)" >&2
started=$(date +%s)
cmd="$mod/cmd/helm"
(
  cd "$here"
  export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod"
  # As helm's Makefile does: the default Kubernetes version of `helm template` and `helm lint`
  # (`.Capabilities.KubeVersion`, the deprecation checks) follows the client-go it links, one
  # major version up (client-go v0.37 is Kubernetes 1.37). Unset, it would be 1.20.
  client_go="$(go list -m -f '{{.Version}}' k8s.io/client-go)"
  k8s="${client_go#v0.}"
  k8s_minor="${k8s%%.*}"
  ldflags="-s -w -X $mod/internal/version.version=$version -X $mod/internal/version.gitTreeState=clean"
  for p in pkg/lint/rules pkg/chartutil; do
    ldflags+=" -X $mod/$p.k8sVersionMajor=1 -X $mod/$p.k8sVersionMinor=$k8s_minor"
  done
  # How many packages there are to compile, for the progress lines (-v prints each one built).
  { go list -deps "$cmd" | wc -l; } >"$tmp/.packages" 2>/dev/null || true
  go build -v -trimpath -ldflags "$ldflags" -o "$tmp/helm" "$cmd"
) >"$log" 2>&1 &
build=$!
# A line at least every 30 s: a cold build is silent for minutes otherwise.
while kill -0 "$build" 2>/dev/null; do
  for _ in $(seq 30); do
    kill -0 "$build" 2>/dev/null || break
    sleep 1
  done
  kill -0 "$build" 2>/dev/null || break
  total=$(cat "$tmp/.packages" 2>/dev/null || true)
  done_count=$(grep -c -v -e '^go: ' -e '^#' "$log" 2>/dev/null || true)
  echo "helm: building, ${done_count:-0} of ${total:-?} packages compiled, $(( $(date +%s) - started ))s elapsed" >&2
done
wait "$build" || { echo "helm: go build failed; see $log" >&2; tail -20 "$log" >&2; exit 1; }
mkdir -p "$out"
mv "$tmp/helm" "$bin"
echo "helm: built in $(( $(date +%s) - started ))s: $(du -sh "$bin" | cut -f1)" >&2
echo "$bin"
