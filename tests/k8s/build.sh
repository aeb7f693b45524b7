#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl and kube-proxy
# from the upstream k8s.io/kubernetes module that tests/k8s/go.mod requires, or reuses an earlier
# build. The binaries are cached outside the work tree, under
#   $K8S_CACHE_DIR/<kubernetes version>/<first 16 hex digits of sha256(go.sum)>/bin
# (default K8S_CACHE_DIR=/var/cache/cablemesh/k8s), so every clone and worktree on the machine
# shares them; a different version or go.sum builds into a new directory. Only the binaries the
# cache lacks are built; each lands whole (built in a temporary directory, then renamed into
# place), and builds are serialised by a lock, so concurrent callers wait for one build.
#
# Prints the bin directory on stdout (bin=$(tests/k8s/build.sh)); progress goes to stderr.
#
# A cold build is CPU-heavy (about 14 minutes on 2 idle cores): it runs under `nice -n 19` with
# K8S_BUILD_JOBS (default 1) packages compiled at a time, so it does not starve other work.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
go=${GO:-go}
cache_root=${K8S_CACHE_DIR:-/var/cache/cablemesh/k8s}
jobs=${K8S_BUILD_JOBS:-1}
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy)

log() { echo "k8s-build: $*" >&2; }
die() { log "$*"; exit 1; }

[[ $jobs =~ ^[1-9][0-9]*$ ]] || die "K8S_BUILD_JOBS must be a positive integer, got '$jobs'"
command -v "$go" >/dev/null || die "go ('$go') is not installed"

cd "$here"
# The version comes from go.mod (not a constant here) so bumping it there is the whole upgrade.
version=$("$go" list -mod=readonly -m -f '{{.Version}}' k8s.io/kubernetes) ||
	die "cannot read the k8s.io/kubernetes version from $here/go.mod"
[[ $version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || die "unexpected k8s.io/kubernetes version '$version'"
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
sum=$(sha256sum go.sum | cut -c1-16)
dir=$cache_root/$version/$sum
bin=$dir/bin

# missing prints the binaries not yet in the cache.
missing() {
	local b
	for b in "${binaries[@]}"; do [[ -x $bin/$b ]] || echo "$b"; done
}
complete() { [[ -z $(missing) ]]; }

if complete; then
	log "reusing $bin"
	echo "$bin"
	exit 0
fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
log "waiting for the build lock $dir/.lock"
flock 9
if complete; then # another caller built it while we waited
	log "reusing $bin"
	echo "$bin"
	exit 0
fi

# The same version stamps as upstream's hack/lib/version.sh: without gitVersion, kubectl cannot
# parse the server's version and the API server reports v0.0.0-master.
ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
	ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

tmp=$(mktemp -d "$dir/bin.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mapfile -t build < <(missing)
pkgs=()
for b in "${build[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
log "building ${build[*]} $version into $bin (nice 19, $jobs package(s) at a time; a cold build takes 15-30 minutes)"
start=$SECONDS
# Upstream builds these statically (CGO_ENABLED=0) with the selinux,notest,grpcnotrace tags.
CGO_ENABLED=0 nice -n 19 "$go" build -mod=readonly -p "$jobs" -trimpath \
	-tags selinux,notest,grpcnotrace -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}"
# Each binary lands whole (rename), so a reader never sees a partial one.
mkdir -p "$bin"
for b in "${build[@]}"; do mv -f "$tmp/$b" "$bin/$b"; done
rm -rf "$tmp"
trap - EXIT
log "built in $((SECONDS - start)) s"
"$bin/kubectl" version --client >&2
echo "$bin"
