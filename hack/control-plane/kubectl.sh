#!/usr/bin/env bash
# kubectl for the tests and e2e scenarios: the one on the PATH, or, when there is none, kubectl
# built from the control plane's Go module (the same Kubernetes version) into the cache beside
# the control plane's binaries, once. Prints the directory holding kubectl on its last line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if command -v kubectl >/dev/null; then
  dirname "$(command -v kubectl)"
  exit 0
fi
k8s_version="$(awk '$1=="k8s.io/kubernetes" {print $2}' "$here/go.mod" | head -1)"
out="${QDB_CONTROL_PLANE_CACHE:-$HOME/.cache/qdb-control-plane}/kubectl-${k8s_version}-$(sha256sum "$here/go.sum" | cut -c1-12)"
if [[ ! -x "$out/kubectl" ]]; then
  command -v go >/dev/null || { echo "kubectl: not installed, and no Go to build it" >&2; exit 1; }
  echo "kubectl: not on the PATH; building kubectl ${k8s_version} from the control plane's Go module into $out" >&2
  mkdir -p "$out"
  pkg=k8s.io/component-base/version
  (cd "$here" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod" go build -trimpath \
    -ldflags "-s -w -X $pkg.gitVersion=$k8s_version -X k8s.io/client-go/pkg/version.gitVersion=$k8s_version" \
    -o "$out/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl)
  mv "$out/kubectl.tmp" "$out/kubectl"
fi
echo "$out"
