#!/usr/bin/env bash
# Builds the helm command from the helm.sh/helm/v3 module that tests/helm/go.mod requires (a
# `tool` directive there), or reuses an earlier build, as tests/k8s/build.sh does for the
# Kubernetes binaries. The binary is cached outside the work tree, under
#   $HELM_CACHE_DIR/<helm version>/<first 16 hex digits of sha256(go.sum)>/bin/helm
# (default HELM_CACHE_DIR=/var/cache/cablemesh/helm), shared by every clone and worktree; it lands
# whole (built in a temporary directory, then renamed), and builds are serialised by a lock.
# Offline once the module cache holds the modules (go mod download in tests/helm).
#
# Prints the bin directory on stdout (bin=$(tests/helm/build.sh)); progress goes to stderr.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
go=${GO:-go}
cache_root=${HELM_CACHE_DIR:-/var/cache/cablemesh/helm}

log() { echo "helm-build: $*" >&2; }
die() { log "$*"; exit 1; }

command -v "$go" >/dev/null || die "go ('$go') is not installed"
cd "$here"
version=$("$go" list -mod=readonly -m -f '{{.Version}}' helm.sh/helm/v3) ||
	die "cannot read the helm.sh/helm/v3 version from $here/go.mod"
[[ $version =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "unexpected helm.sh/helm/v3 version '$version'"
sum=$(sha256sum go.sum | cut -c1-16)
dir=$cache_root/$version/$sum
bin=$dir/bin

if [[ -x $bin/helm ]]; then
	log "reusing $bin/helm"
	echo "$bin"
	exit 0
fi
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if [[ -x $bin/helm ]]; then # another caller built it while we waited
	echo "$bin"
	exit 0
fi
tmp=$(mktemp -d "$dir/bin.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "building helm $version into $bin (nice 19)"
start=$SECONDS
# The version stamp upstream's Makefile sets, so `helm version` tells what it is.
CGO_ENABLED=0 nice -n 19 "$go" build -mod=readonly -trimpath \
	-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
	-o "$tmp/helm" helm.sh/helm/v3/cmd/helm
mkdir -p "$bin"
mv -f "$tmp/helm" "$bin/helm"
log "built in $((SECONDS - start)) s: $("$bin/helm" version --short)"
echo "$bin"
