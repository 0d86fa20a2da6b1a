#!/usr/bin/env bash
# Builds the real CSI snapshot-controller (kubernetes-csi/external-snapshotter) the tests run
# against from the Go module pinned in go.mod, into a cache directory keyed by that version, and
# puts beside it the VolumeSnapshot CRDs of the client module it is compiled against. Does
# nothing when they are already there. Prints the directory on its last line.
#   QDB_CONTROL_PLANE_CACHE  cache root (default ~/.cache/qdb-control-plane)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod=github.com/kubernetes-csi/external-snapshotter/v8
client_mod=github.com/kubernetes-csi/external-snapshotter/client/v8
version="$(awk -v m="$mod" '$1==m && $2 ~ /^v/ {print $2}' "$here/go.mod" | head -1)"
# The CRDs must be the ones of the API types the controller links (go.mod's client version).
client_version="$(awk -v m="$client_mod" '$1==m && $2 ~ /^v/ {print $2}' "$here/go.mod" | head -1)"
key="snapshot-controller-${version}-$(sha256sum "$here/go.sum" | cut -c1-12)"
root="${QDB_CONTROL_PLANE_CACHE:-$HOME/.cache/qdb-control-plane}"
out="$root/$key"
crds=(snapshot.storage.k8s.io_volumesnapshotclasses.yaml
  snapshot.storage.k8s.io_volumesnapshotcontents.yaml
  snapshot.storage.k8s.io_volumesnapshots.yaml)

complete() {
  [[ -x "$out/snapshot-controller" ]] || return 1
  for c in "${crds[@]}"; do [[ -s "$out/$c" ]] || return 1; done
}
if complete; then
  echo "$out"
  exit 0
fi
# --if-built: only say whether it is built (the sandbox starts without it when it is not, and
# adds it once its build ends); exit 3, building nothing, when it is not.
[[ "${1:-}" == "--if-built" ]] && exit 3

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
  echo "snapshot-controller: a build is already under way (log: $log); waiting for it" >&2
  waited=$(date +%s)
  until flock -w 30 9; do
    total=$(cat "$out".tmp.*/.packages 2>/dev/null | head -1 || true)
    done_count=$(grep -c -v -e '^go: ' -e '^#' "$log" 2>/dev/null || true)
    echo "snapshot-controller: building, ${done_count:-0} of ${total:-?} packages compiled, waited $(( $(date +%s) - waited ))s" >&2
  done
fi
if complete; then
  echo "$out"
  exit 0
fi

if ! command -v go >/dev/null; then
  echo "snapshot-controller: Go is not installed; cannot build the CSI snapshot-controller ${version} (install Go 1.26+)" >&2
  exit 1
fi

tmp="$out.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
echo "snapshot-controller: building ${mod}/cmd/snapshot-controller ${version} into $out (first time only; about 3-6 min on 2 cores; log: $log)" >&2
started=$(date +%s)
cmd="$mod/cmd/snapshot-controller"
(
  cd "$here"
  export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod"
  # The CRDs ship in the client module's source (config/crd/), which the build downloads anyway.
  client_dir="$(go mod download -json "$client_mod@$client_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -n "$client_dir" ]] || { echo "no module directory for $client_mod@$client_version"; exit 1; }
  for c in "${crds[@]}"; do cp "$client_dir/config/crd/$c" "$tmp/$c"; done
  # How many packages there are to compile, for the progress lines (-v prints each one built).
  { go list -deps "$cmd" | wc -l; } >"$tmp/.packages" 2>/dev/null || true
  go build -v -trimpath -ldflags "-s -w -X main.version=$version" -o "$tmp/snapshot-controller" "$cmd"
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
  echo "snapshot-controller: building, ${done_count:-0} of ${total:-?} packages compiled, $(( $(date +%s) - started ))s elapsed" >&2
done
wait "$build" || { echo "snapshot-controller: go build failed; see $log" >&2; tail -20 "$log" >&2; exit 1; }
mkdir -p "$out"
# The CRDs first: the binary is what `complete` checks first.
for c in "${crds[@]}"; do chmod 0644 "$tmp/$c"; mv "$tmp/$c" "$out/$c"; done
mv "$tmp/snapshot-controller" "$out/snapshot-controller"
echo "snapshot-controller: built in $(( $(date +%s) - started ))s: $(du -sh "$out/snapshot-controller" | cut -f1)" >&2
echo "$out"
