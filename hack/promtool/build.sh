#!/usr/bin/env bash
# Builds the real `promtool` that checks and unit-tests the alert rules of
# deploy/prometheusrule (tests/prometheus_rules.rs), from the Go module pinned in go.mod, into a
# cache directory keyed by that version. Does nothing when the binary is already there. Prints
# the binary's path on its last line.
#   QDB_PROMTOOL_CACHE  cache root (default ~/.cache/qdb-promtool)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod=github.com/prometheus/prometheus
version="$(awk -v m="$mod" '$1==m && $2 ~ /^v/ {print $2}' "$here/go.mod" | head -1)"
[[ -n "$version" ]] || { echo "promtool: no version of $mod in $here/go.mod" >&2; exit 1; }
key="promtool-${version}-$(sha256sum "$here/go.sum" | cut -c1-12)"
root="${QDB_PROMTOOL_CACHE:-$HOME/.cache/qdb-promtool}"
out="$root/$key"
bin="$out/promtool"
[[ -x "$bin" ]] && { echo "$bin"; exit 0; }

# One build at a time (two test binaries, or CI and a developer, may start together).
mkdir -p "$root"
exec 9>"$root/.lock-$key"
log="$root/build-$key.log"
flock -n 9 || { echo "promtool: a build is already under way (log: $log); waiting for it" >&2; flock 9; }
[[ -x "$bin" ]] && { echo "$bin"; exit 0; }
command -v go >/dev/null || {
  echo "promtool: Go is not installed; cannot build promtool ${version} (install Go 1.26+, or set QDB_PROMTOOL_BIN to a promtool binary)" >&2
  exit 1
}
tmp="$out.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
echo "promtool: building $mod/cmd/promtool $version into $out (first time only; about 3-6 min on 2 cores; log: $log)" >&2
started=$(date +%s)
(
  cd "$here"
  export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod"
  # The module's v0.316.0 is Prometheus 3.16.0.
  release="${version#v0.}"
  go build -v -trimpath -ldflags "-s -w -X github.com/prometheus/common/version.Version=${release:0:1}.${release:1}" \
    -o "$tmp/promtool" "$mod/cmd/promtool"
) >"$log" 2>&1 &
build=$!
# A line at least every 30 s: a cold build is silent for minutes otherwise.
while kill -0 "$build" 2>/dev/null; do
  for _ in $(seq 30); do
    kill -0 "$build" 2>/dev/null || break
    sleep 1
  done
  kill -0 "$build" 2>/dev/null || break
  echo "promtool: building, $(grep -c -v -e '^go: ' -e '^#' "$log" 2>/dev/null || true) packages compiled, $(( $(date +%s) - started ))s elapsed" >&2
done
wait "$build" || { echo "promtool: go build failed; see $log" >&2; tail -20 "$log" >&2; exit 1; }
mkdir -p "$out"
mv "$tmp/promtool" "$bin"
echo "promtool: built in $(( $(date +%s) - started ))s: $(du -sh "$bin" | cut -f1)" >&2
echo "$bin"
