#!/usr/bin/env bash
# One real Kubernetes cluster on this machine, from upstream binaries (tests/k8s/build.sh):
#
#   cluster.sh up NAME INDEX [NODE...]   bring up cluster NAME (INDEX 1-99 picks its addresses)
#   cluster.sh down NAME                 remove all of it; idempotent, also after a failed up
#   cluster.sh import NAME ARCHIVE...    import image archives (docker-archive) into every node
#   cluster.sh nodeexec NAME NODE CMD... run CMD in a node's network and mount namespace
#   cluster.sh check                     check that the programs it needs are installed
#   cluster.sh rss NAME                  the resident memory of every process of the cluster
#
# Layout of cluster NAME with index I (NODE defaults to "gw worker"; node names are NAME-NODE):
#   - a bridge ck<I>br in the host's network namespace holding 172.29.<I>.1/24: the host's only
#     foothold, so kubectl and tests reach the API server from the host;
#   - the control plane in network namespace ck8-NAME-cp at 172.29.<I>.2: etcd on its loopback,
#     kube-apiserver on :6443 (advertised at 172.29.<I>.2, not loopback: the `kubernetes` Service's
#     endpoint must be reachable from the nodes; it reaches kubelets at their InternalIP, as no DNS
#     knows the node names), kube-controller-manager (allocates each node a /24
#     of the pod CIDR 10.<I>.0.0/16), kube-scheduler;
#   - each node in network namespace ck8-NAME-NODE at 172.29.<I>.11, .12, ... and a mount
#     namespace of its own in which /var/lib, /var/log and /run are the node's directories under the
#     state dir (a kubelet writes fixed paths there: /var/lib/kubelet, /var/log/pods, the CRI's
#     /run/containerd...) and /sys/fs/bpf is a bpffs of its own; containerd, the kubelet and, when
#     built, kube-proxy run there. The kubelet's pods live under the cgroup /cablemesh-k8s/NAME-NODE
#     of every v1 hierarchy (cgroupRoot), not the host's kubepods. Pods get addresses from the
#     bridge CNI plugin on the node's /24; nodes route each other's /24s over the cluster bridge.
#     Services: 10.96.<I>.0/24 (the README's example), kube-proxy in iptables mode per node.
# State (PKI, kubeconfigs, logs, node roots) is under $CABLEMESH_K8S_DIR/NAME (default
# /tmp/cablemesh-k8s/NAME); the admin kubeconfig is $CABLEMESH_K8S_DIR/NAME/kubeconfig.
#
# Images cannot be pulled here: every node imports the archives in $CABLEMESH_K8S_DIR/images at
# start (the pause image, built with buildah from tests/k8s/cmd/pause, is made there on first use).
# Needs root, the binaries of tests/k8s/DEPENDENCIES.md, and the Kubernetes binaries ($K8S_BIN, or
# built or reused by tests/k8s/build.sh).
set -euo pipefail

K8S_DIR_SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE_ROOT=${CABLEMESH_K8S_DIR:-/tmp/cablemesh-k8s}
PAUSE_IMAGE=docker.io/cablemesh/pause:3.10
PROBE_IMAGE=docker.io/cablemesh/k8s-probe:test
CGROUP_PARENT=cablemesh-k8s
CNI_BIN=${CNI_BIN:-/usr/lib/cni}
CGROUP2=/sys/fs/cgroup/unified

log() { printf '%s k8s: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---- naming ------------------------------------------------------------------------------------

check_name() {
	[[ $1 =~ ^[a-z]([a-z0-9-]{0,10}[a-z0-9])?$ ]] ||
		die "cluster name '$1' must be a DNS label of at most 12 characters"
}
check_index() {
	[[ $1 =~ ^[1-9][0-9]?$ ]] || die "cluster index '$1' must be an integer from 1 to 99"
}

# Everything of a cluster is named from these, so down can find it from the name alone.
cluster_vars() {
	C=$1
	S=$STATE_ROOT/$C
	NS_CP=ck8-$C-cp
	if [[ -f $S/index ]]; then I=$(<"$S/index"); else I=${2:-}; fi
	if [[ -n $I ]]; then
		BR=ck${I}br
		NET=172.29.$I
		CP_IP=$NET.2
		POD_CIDR=10.$I.0.0/16
		SVC_CIDR=10.96.$I.0/24
		KUBE_SVC_IP=10.96.$I.1
		DNS_SVC_IP=10.96.$I.10
	fi
}

# ---- helpers -----------------------------------------------------------------------------------

k8s_bin() {
	if [[ -z ${K8S_BIN:-} ]]; then
		K8S_BIN=$("$K8S_DIR_SELF/build.sh")
	fi
	local b
	for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
		[[ -x $K8S_BIN/$b ]] || die "$K8S_BIN/$b is missing (run tests/k8s/build.sh)"
	done
	export K8S_BIN
}

check_tools() {
	local missing=() t
	for t in etcd containerd containerd-shim-runc-v2 runc ctr buildah openssl curl iptables ip nsenter unshare; do
		command -v "$t" >/dev/null 2>&1 || missing+=("$t")
	done
	[[ -x $CNI_BIN/bridge && -x $CNI_BIN/host-local && -x $CNI_BIN/loopback ]] || missing+=("$CNI_BIN/{bridge,host-local,loopback}")
	((${#missing[@]} == 0)) || die "missing ${missing[*]}; see tests/k8s/DEPENDENCIES.md"
	[[ $(stat -f -c %T /sys/fs/cgroup 2>/dev/null) == tmpfs && -d /sys/fs/cgroup/memory ]] ||
		die "expected cgroup v1 hierarchies under /sys/fs/cgroup (the kubelet here runs with failCgroupV1: false)"
}

kubectl_admin() { "$K8S_BIN/kubectl" --kubeconfig "$S/kubeconfig" "$@"; }

# wait_for SECONDS WHAT CMD...: retries CMD until it succeeds, at most SECONDS.
wait_for() {
	local secs=$1 what=$2 start=$SECONDS
	shift 2
	until "$@" >/dev/null 2>&1; do
		((SECONDS - start < secs)) || die "timed out after ${secs}s waiting for $what"
		sleep 0.5
	done
}

# start_bg PIDFILE LOG CMD...: CMD detached in its own session; its pid in PIDFILE.
start_bg() {
	local pidfile=$1 logfile=$2
	shift 2
	setsid "$@" >>"$logfile" 2>&1 </dev/null &
	echo $! >"$pidfile"
}

in_cp() { nsenter --net="/run/netns/$NS_CP" "$@"; }

# ---- PKI ---------------------------------------------------------------------------------------

# cert NAME CN O SANS: a key and a certificate signed by the cluster CA, for serving and clients.
cert() {
	local name=$1 cn=$2 o=$3 sans=$4 p=$S/pki
	local subj="/CN=$cn"
	[[ -n $o ]] && subj+="/O=$o"
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$p/$name.key" \
		-subj "$subj" -out "$p/$name.csr" 2>/dev/null
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=serverAuth,clientAuth"
		[[ -n $sans ]] && echo "subjectAltName=$sans"
	} >"$p/$name.ext"
	openssl x509 -req -in "$p/$name.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial -days 30 \
		-extfile "$p/$name.ext" -out "$p/$name.crt" 2>/dev/null
	rm -f "$p/$name.csr" "$p/$name.ext"
}

# kubeconfig FILE CERTNAME: a self-contained kubeconfig for the API server at its advertised address.
kubeconfig() {
	local file=$1 name=$2 p=$S/pki
	cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $C
  cluster:
    server: https://$CP_IP:6443
    certificate-authority-data: $(base64 -w0 "$p/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(base64 -w0 "$p/$name.crt")
    client-key-data: $(base64 -w0 "$p/$name.key")
contexts:
- name: $C
  context: {cluster: $C, user: $name}
current-context: $C
EOF
	chmod 600 "$file"
}

make_pki() {
	local p=$S/pki n
	mkdir -p "$p"
	chmod 700 "$p"
	openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
		-keyout "$p/ca.key" -subj "/CN=cablemesh-k8s-$C-ca" -out "$p/ca.crt" 2>/dev/null
	cert apiserver kube-apiserver "" \
		"IP:$CP_IP,IP:$KUBE_SVC_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	cert admin kubernetes-admin system:masters ""
	# The API server's client certificate for the kubelets (logs, exec, port-forward).
	cert apiserver-kubelet apiserver-kubelet-client system:masters ""
	cert controller-manager system:kube-controller-manager "" ""
	cert scheduler system:kube-scheduler "" ""
	cert kube-proxy system:kube-proxy "" ""
	for n in "$@"; do
		cert "node-$n" "system:node:$C-$n" system:nodes ""
	done
	openssl ecparam -name prime256v1 -genkey -noout -out "$p/sa.key" 2>/dev/null
	openssl ec -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
	kubeconfig "$S/kubeconfig" admin
	kubeconfig "$S/controller-manager.kubeconfig" controller-manager
	kubeconfig "$S/scheduler.kubeconfig" scheduler
	kubeconfig "$S/kube-proxy.kubeconfig" kube-proxy
	for n in "$@"; do
		kubeconfig "$S/nodes/$n/kubelet.kubeconfig" "node-$n"
	done
}

# ---- images ------------------------------------------------------------------------------------

# go_image_archive NAME IMAGE: tests/k8s/cmd/NAME as /NAME (the entrypoint) on an empty base, as
# a docker-archive $STATE_ROOT/images/NAME.tar (whose repo tag ctr keeps exactly, so the CRI finds
# it under IMAGE). Made once; the nodes import every archive there at start.
go_image_archive() {
	local name=$1 image=$2 out=$STATE_ROOT/images/$1.tar tmp ctr
	[[ -s $out ]] && return 0
	mkdir -p "$STATE_ROOT/images"
	tmp=$(mktemp -d)
	log "building the image $image"
	(cd "$K8S_DIR_SELF" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/$name" "./cmd/$name")
	export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
	ctr=$(buildah from scratch)
	buildah copy --chmod 0755 "$ctr" "$tmp/$name" "/$name" >/dev/null
	# The probe also answers to /call (make k8s-demo's `kubectl exec client -- /call HOST:PORT`).
	[[ $name != probe ]] || buildah copy --chmod 0755 "$ctr" "$tmp/$name" /call >/dev/null
	buildah config --entrypoint "[\"/$name\"]" --cmd '' "$ctr"
	buildah commit --quiet "$ctr" "docker-archive:$out.tmp:$image" >/dev/null
	buildah rm "$ctr" >/dev/null
	mv "$out.tmp" "$out"
	rm -rf "$tmp"
}

# The pod sandbox image, and the test pods' image (tests/k8s/cmd/probe).
pause_archive() { go_image_archive pause "$PAUSE_IMAGE"; }
probe_archive() { go_image_archive probe "$PROBE_IMAGE"; }

# ---- network -----------------------------------------------------------------------------------

# netns_with_veth NS HOSTLINK ADDR: a network namespace joined to the cluster bridge as eth0.
netns_with_veth() {
	local ns=$1 link=$2 addr=$3
	ip netns add "$ns"
	ip -n "$ns" link set lo up
	ip link add "$link" type veth peer name eth0 netns "$ns"
	ip link set "$link" master "$BR" up
	ip -n "$ns" addr add "$addr/24" dev eth0
	ip -n "$ns" link set eth0 up
}

make_network() {
	ip link add "$BR" type bridge
	ip addr add "$NET.1/24" dev "$BR"
	ip link set "$BR" up
	netns_with_veth "$NS_CP" "ck${I}cp" "$CP_IP"
}

# ---- control plane -----------------------------------------------------------------------------

start_control_plane() {
	local p=$S/pki l=$S/logs
	mkdir -p "$S/etcd" "$l"
	chmod 700 "$S/etcd"
	start_bg "$S/pids/etcd" "$l/etcd.log" nsenter --net="/run/netns/$NS_CP" etcd --name "$C" \
		--data-dir "$S/etcd" --listen-client-urls http://127.0.0.1:2379 \
		--advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
		--initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster "$C=http://127.0.0.1:2380" \
		--listen-metrics-urls http://127.0.0.1:2381
	wait_for 30 "etcd of $C" in_cp curl -sf http://127.0.0.1:2379/health

	start_bg "$S/pids/kube-apiserver" "$l/kube-apiserver.log" nsenter --net="/run/netns/$NS_CP" \
		"$K8S_BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
		--advertise-address="$CP_IP" --bind-address=0.0.0.0 --secure-port=6443 \
		--service-cluster-ip-range="$SVC_CIDR" --allow-privileged=true \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--client-ca-file="$p/ca.crt" --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
		--kubelet-client-certificate="$p/apiserver-kubelet.crt" --kubelet-client-key="$p/apiserver-kubelet.key" \
		--kubelet-preferred-address-types=InternalIP \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
		--profiling=false --v=1
	wait_for 90 "kube-apiserver of $C" curl -sf --cacert "$p/ca.crt" --cert "$p/admin.crt" --key "$p/admin.key" \
		"https://$CP_IP:6443/readyz"

	start_bg "$S/pids/kube-controller-manager" "$l/kube-controller-manager.log" nsenter --net="/run/netns/$NS_CP" \
		"$K8S_BIN/kube-controller-manager" --kubeconfig="$S/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$S/controller-manager.kubeconfig" \
		--authorization-kubeconfig="$S/controller-manager.kubeconfig" \
		--bind-address=127.0.0.1 --leader-elect=false --cluster-name="$C" \
		--use-service-account-credentials=true --service-account-private-key-file="$p/sa.key" \
		--root-ca-file="$p/ca.crt" --allocate-node-cidrs=true --cluster-cidr="$POD_CIDR" \
		--node-cidr-mask-size=24 --service-cluster-ip-range="$SVC_CIDR" --profiling=false --v=1
	start_bg "$S/pids/kube-scheduler" "$l/kube-scheduler.log" nsenter --net="/run/netns/$NS_CP" \
		"$K8S_BIN/kube-scheduler" --kubeconfig="$S/scheduler.kubeconfig" \
		--authentication-kubeconfig="$S/scheduler.kubeconfig" --authorization-kubeconfig="$S/scheduler.kubeconfig" \
		--bind-address=127.0.0.1 --leader-elect=false --profiling=false --v=1
}

# ---- nodes -------------------------------------------------------------------------------------

node_ip() { echo "$NET.$((10 + $1))"; }

write_node_configs() {
	local n=$1 ip=$2 nd=$S/nodes/$1
	mkdir -p "$nd/cni"
	cat >"$nd/containerd.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd-opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # root here lacks CAP_SYS_RESOURCE: runc cannot lower a process's oom_score_adj below its own
  # and fails with "can't get final child's PID from pipe" unless the CRI clamps it.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$nd/cni-conf"
    conf_template = "$nd/cni.template"
EOF
	# containerd writes the CNI config from this once the kubelet reports the node's pod CIDR.
	cat >"$nd/cni.template" <<'EOF'
{
  "cniVersion": "0.4.0",
  "name": "cablemesh-k8s",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "{{.PodCIDR}}"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
	cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host is cgroup v1 (cgroup2 only at /sys/fs/cgroup/unified, with no controllers).
failCgroupV1: false
cgroupDriver: cgroupfs
# The node's pods under a cgroup of their own, not the host's /kubepods shared by every node.
cgroupRoot: /$CGROUP_PARENT/$C-$n
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $S/pki/ca.crt}
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS: [$DNS_SVC_IP]
resolvConf: $nd/resolv.conf
failSwapOn: false
protectKernelDefaults: false
serializeImagePulls: false
maxPods: 40
podPidsLimit: -1
# Disks are shared with the rest of the machine: evict only when really short.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
syncFrequency: 10s
# Lowering it needs CAP_SYS_RESOURCE, which root lacks here.
oomScoreAdj: 0
fileCheckFrequency: 10s
EOF
	: >"$nd/resolv.conf"
	if [[ -x $K8S_BIN/kube-proxy ]]; then
		cat >"$nd/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $POD_CIDR
oomScoreAdj: 0
hostnameOverride: $C-$n
bindAddress: $ip
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clientConnection:
  kubeconfig: $S/kube-proxy.kubeconfig
# nf_conntrack_max is global and read-only in a network namespace: leave the conntrack sysctls.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
	fi
}

# The cgroup the kubelet puts this node's pods under, in every v1 hierarchy (cgroupRoot must exist).
make_node_cgroups() {
	local n=$1 h d
	for h in /sys/fs/cgroup/*/; do
		h=${h%/}
		[[ $(stat -f -c %T "$h") == cgroupfs ]] || continue
		d=$h/$CGROUP_PARENT
		mkdir -p "$d/$C-$n"
		if [[ -f $h/cpuset.cpus ]]; then
			cat "$h/cpuset.cpus" >"$d/cpuset.cpus"
			cat "$h/cpuset.mems" >"$d/cpuset.mems"
			cat "$h/cpuset.cpus" >"$d/$C-$n/cpuset.cpus"
			cat "$h/cpuset.mems" >"$d/$C-$n/cpuset.mems"
		fi
	done
}

start_node() {
	local n=$1 idx=$2 ip nd=$S/nodes/$1 ns=ck8-$C-$1
	ip=$(node_ip "$idx")
	write_node_configs "$n" "$ip"
	make_node_cgroups "$n"
	netns_with_veth "$ns" "ck${I}n$idx" "$ip"
	# Services are DNATed by kube-proxy in OUTPUT/PREROUTING, after the route lookup: the service
	# range needs a route out of the node. No default route: nothing leaves the namespaces.
	ip -n "$ns" route add "$SVC_CIDR" dev eth0
	ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
	mkdir -p "$nd/var-lib" "$nd/var-log" "$nd/run"
	start_bg "$nd/node.pid" "$nd/node.log" nsenter --net="/run/netns/$ns" \
		unshare --mount --propagation slave -- "$K8S_DIR_SELF/cluster.sh" _node_run "$C" "$n" "$ip"
}

# _node_run NAME NODE IP: inside the node's new mount namespace (and its network namespace):
# private /var/lib, /var/log and /run, a bpffs, then containerd, the kubelet and kube-proxy.
# Stays as the namespace's holder process until killed.
node_run() {
	local n=$1 ip=$2 nd=$S/nodes/$1 l=$S/nodes/$1/logs d
	mkdir -p "$l"
	mount --bind "$nd/var-lib" /var/lib
	mount --bind "$nd/var-log" /var/log
	mount --bind "$nd/run" /run
	mkdir -p /var/lib/kubelet /var/log/pods /var/log/containers /run/containerd /run/netns "$nd/cni-conf"
	mount -t bpf bpf /sys/fs/bpf
	node_cgroup2 "$n"
	# Shared within the node (kubelet volumes, HostToContainer propagation), still a slave of the
	# host's mounts so nothing made here shows on the host.
	mount --make-rshared /
	echo $$ >"$nd/holder.pid"

	containerd --config "$nd/containerd.toml" >>"$l/containerd.log" 2>&1 </dev/null &
	echo $! >"$nd/containerd.pid"
	local i
	for ((i = 0; i < 120; i++)); do
		ctr --address /run/containerd/containerd.sock version >/dev/null 2>&1 && break
		sleep 0.5
	done
	local a
	for a in "$STATE_ROOT"/images/*.tar; do
		[[ -e $a ]] || continue
		ctr --address /run/containerd/containerd.sock -n k8s.io images import --no-unpack=false "$a" >>"$l/import.log" 2>&1 ||
			echo "import of $a failed" >>"$l/import.log"
	done
	"$K8S_BIN/kubelet" --config="$nd/kubelet.yaml" --kubeconfig="$nd/kubelet.kubeconfig" \
		--hostname-override="$C-$n" --node-ip="$ip" --v=1 >>"$l/kubelet.log" 2>&1 </dev/null &
	echo $! >"$nd/kubelet.pid"
	if [[ -f $nd/kube-proxy.yaml ]]; then
		"$K8S_BIN/kube-proxy" --config="$nd/kube-proxy.yaml" --v=1 >>"$l/kube-proxy.log" 2>&1 </dev/null &
		echo $! >"$nd/kube-proxy.pid"
	fi
	exec sleep infinity
}

# node_cgroup2 NODE: the node's own cgroup2 directory, shown to the node as its cgroup2 mount.
# This host is hybrid (cgroup2 at /sys/fs/cgroup/unified, no controllers in it): the holder
# joins /cablemesh-k8s/NAME-NODE there, so containerd, the kubelet and every pod they start sit
# below it, and that directory is bind-mounted over /sys/fs/cgroup/unified in the node's mount
# namespace. A cgroup program the agent attaches at the node's cgroup2 "root" (the DaemonSet
# mounts the host's /sys/fs/cgroup, cgroupPath /host/sys/fs/cgroup/unified on such a host) then
# reaches this node's processes only, as it reaches a real node's.
node_cgroup2() {
	local n=$1 d=$CGROUP2/$CGROUP_PARENT/$C-$1
	[[ $(stat -f -c %T "$CGROUP2" 2>/dev/null) == cgroup2fs ]] || return 0
	mkdir -p "$d"
	echo $$ >"$d/cgroup.procs"
	mount --bind "$d" "$CGROUP2"
}

node_holder() { cat "$S/nodes/$1/holder.pid" 2>/dev/null; }

nodeexec() {
	local n=$1 pid
	shift
	pid=$(node_holder "$n") || die "node $C-$n is not running"
	nsenter -t "$pid" -m -n "$@"
}

# Each node routes the other nodes' pod /24s to them over the cluster bridge.
route_pod_cidrs() {
	local n m cidr
	for n in "${NODES[@]}"; do
		for m in "${NODES[@]}"; do
			[[ $n == "$m" ]] && continue
			cidr=$(kubectl_admin get node "$C-$m" -o jsonpath='{.spec.podCIDR}')
			[[ -n $cidr ]] || die "node $C-$m has no pod CIDR"
			ip -n "ck8-$C-$n" route replace "$cidr" via "$(node_ip "$(node_index "$m")")"
		done
		# The control plane answers pods too (CoreDNS's kubernetes plugin calls the API server
		# through the kubernetes Service from its pod address; kube-proxy does not masquerade it).
		cidr=$(kubectl_admin get node "$C-$n" -o jsonpath='{.spec.podCIDR}')
		in_cp ip route replace "$cidr" via "$(node_ip "$(node_index "$n")")"
	done
}

node_index() {
	local i=1 n
	for n in "${NODES[@]}"; do
		[[ $n == "$1" ]] && { echo "$i"; return; }
		i=$((i + 1))
	done
	die "no node $1"
}

node_has_pod_cidr() { [[ -n $(kubectl_admin get node "$1" -o jsonpath='{.spec.podCIDR}' 2>/dev/null) ]]; }
node_ready() {
	[[ $(kubectl_admin get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

# ---- up / down ---------------------------------------------------------------------------------

up() {
	local name=$1 index=$2
	shift 2
	check_name "$name"
	check_index "$index"
	NODES=("$@")
	((${#NODES[@]})) || NODES=(gw worker)
	local n
	for n in "${NODES[@]}"; do
		[[ $n =~ ^[a-z][a-z0-9]{0,9}$ ]] || die "node name '$n' must be lowercase letters and digits, at most 10"
	done
	[[ $(id -u) == 0 ]] || die "run as root (network namespaces, mounts, cgroups)"
	check_tools
	k8s_bin
	down "$name"
	cluster_vars "$name" "$index"
	if ip link show "$BR" >/dev/null 2>&1; then
		die "bridge $BR exists already: another cluster uses index $I"
	fi
	local t0=$SECONDS
	mkdir -p "$S/pids" "$S/logs"
	chmod 700 "$S"
	echo "$I" >"$S/index"
	printf '%s\n' "${NODES[@]}" >"$S/nodes.list"
	for n in "${NODES[@]}"; do mkdir -p "$S/nodes/$n"; done
	log "cluster $C: PKI, network ($NET.0/24 on $BR), images"
	make_pki "${NODES[@]}"
	make_network
	pause_archive
	probe_archive
	log "cluster $C: control plane"
	start_control_plane
	log "cluster $C: API server ready after $((SECONDS - t0))s; starting nodes ${NODES[*]}"
	local i=1
	for n in "${NODES[@]}"; do
		start_node "$n" "$i"
		i=$((i + 1))
	done
	for n in "${NODES[@]}"; do
		wait_for 120 "node $C-$n to register and get a pod CIDR" node_has_pod_cidr "$C-$n"
	done
	route_pod_cidrs
	for n in "${NODES[@]}"; do
		wait_for 120 "node $C-$n to be Ready" node_ready "$C-$n"
	done
	log "cluster $C: ${#NODES[@]} node(s) Ready after $((SECONDS - t0))s; kubeconfig $S/kubeconfig"
}

# kill_pids_in FILE...: SIGTERM then SIGKILL the processes whose pids the files hold.
kill_pidfiles() {
	local f pid pids=()
	for f in "$@"; do
		[[ -f $f ]] || continue
		pid=$(<"$f")
		[[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && pids+=("$pid")
	done
	((${#pids[@]})) || return 0
	kill -TERM "${pids[@]}" 2>/dev/null || true
	for _ in $(seq 1 20); do
		kill -0 "${pids[@]}" 2>/dev/null || return 0
		sleep 0.25
	done
	kill -KILL "${pids[@]}" 2>/dev/null || true
}

# Processes whose mount namespace is the one a node's holder created: containerd, its shims, the
# kubelet, kube-proxy, and anything they started that stayed in it.
pids_in_mntns() {
	local want=$1 p
	[[ -n $want ]] || return 0
	for p in /proc/[0-9]*; do
		[[ $(readlink "$p/ns/mnt" 2>/dev/null) == "$want" ]] && echo "${p#/proc/}"
	done
}

# Processes in a cgroup tree of any v1 hierarchy (the node's pods).
pids_in_cgroup() {
	local rel=$1 h
	for h in /sys/fs/cgroup/*/; do
		[[ -d $h$rel ]] || continue
		find "$h$rel" -name cgroup.procs -exec cat {} + 2>/dev/null
	done | sort -un
}

remove_cgroup_tree() {
	local rel=$1 h
	for h in /sys/fs/cgroup/*/; do
		[[ -d $h$rel ]] || continue
		# Deepest first; a cgroup with no process left can be removed.
		find "$h$rel" -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
}

down_node() {
	local n=$1 nd=$S/nodes/$1 mntns="" holder pids i
	holder=$(node_holder "$n" || true)
	if [[ $holder =~ ^[0-9]+$ ]] && [[ -e /proc/$holder ]]; then
		mntns=$(readlink "/proc/$holder/ns/mnt" 2>/dev/null || true)
	fi
	# The kubelet first, so it does not restart what is killed next.
	kill_pidfiles "$nd/kubelet.pid" "$nd/kube-proxy.pid"
	for i in 1 2 3 4 5 6 7 8 9 10; do
		pids=$( (pids_in_cgroup "$CGROUP_PARENT/$C-$n"; pids_in_mntns "$mntns") | sort -un | grep -vx "$$" || true)
		[[ -n $pids ]] || break
		# shellcheck disable=SC2086
		if ((i < 3)); then kill -TERM $pids 2>/dev/null || true; else kill -KILL $pids 2>/dev/null || true; fi
		sleep 0.5
	done
	kill_pidfiles "$nd/node.pid"
	remove_cgroup_tree "$CGROUP_PARENT/$C-$n"
	ip netns del "ck8-$C-$n" 2>/dev/null || true
}

down() {
	local name=$1 n
	check_name "$name"
	cluster_vars "$name"
	if [[ -f $S/nodes.list ]]; then
		while read -r n; do [[ -n $n ]] && down_node "$n"; done <"$S/nodes.list"
	fi
	# Nodes whose state a failed run left without nodes.list.
	if [[ -d $S/nodes ]]; then
		for n in "$S"/nodes/*/; do [[ -d $n ]] && down_node "$(basename "$n")"; done
	fi
	kill_pidfiles "$S"/pids/kube-scheduler "$S"/pids/kube-controller-manager "$S"/pids/kube-apiserver
	kill_pidfiles "$S"/pids/etcd
	ip netns del "$NS_CP" 2>/dev/null || true
	local ns
	for ns in $(ip netns list 2>/dev/null | awk -v p="ck8-$C-" 'index($1, p) == 1 {print $1}'); do
		ip netns del "$ns" 2>/dev/null || true
	done
	if [[ -n ${BR:-} ]]; then ip link del "$BR" 2>/dev/null || true; fi
	# The shared parent cgroup goes with the last cluster.
	local h
	for h in /sys/fs/cgroup/*/; do rmdir "$h$CGROUP_PARENT" 2>/dev/null || true; done
	if [[ -d $S ]]; then
		# Nothing may still be mounted below the state dir (a node's mount namespace ends with its
		# last process); refuse to delete through a mount.
		if grep -q " $S/" /proc/self/mountinfo; then
			die "mounts remain under $S; not removing it"
		fi
		rm -rf "$S"
	fi
}

# cluster_pids: every process of the cluster: the control plane's, and each node's (its mount
# namespace's and its pods' cgroups').
cluster_pids() {
	local f pid n holder mntns
	for f in "$S"/pids/*; do
		[[ -f $f ]] || continue
		pid=$(<"$f")
		[[ -e /proc/$pid ]] && echo "$pid"
	done
	[[ -f $S/nodes.list ]] || return 0
	while read -r n; do
		holder=$(node_holder "$n" || true)
		mntns=""
		[[ $holder =~ ^[0-9]+$ ]] && mntns=$(readlink "/proc/$holder/ns/mnt" 2>/dev/null || true)
		pids_in_mntns "$mntns"
		pids_in_cgroup "$CGROUP_PARENT/$C-$n"
	done <"$S/nodes.list"
}

# rss: the cluster's resident memory, per program and in total (MiB).
rss() {
	local pid name kb
	for pid in $(cluster_pids | sort -un); do
		name=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
		kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
		echo "${name:-?} ${kb:-0}"
	done | awk '{kb[$1] += $2; n[$1]++; total += $2}
		END {for (p in kb) printf "%-28s %3d process(es) %7.1f MiB\n", p, n[p], kb[p] / 1024
			printf "%-28s %22.1f MiB\n", "total", total / 1024}'
}

import() {
	local name=$1 n a
	shift
	cluster_vars "$name"
	[[ -f $S/nodes.list ]] || die "cluster $name is not up"
	while read -r n; do
		for a in "$@"; do
			nodeexec "$n" ctr --address /run/containerd/containerd.sock -n k8s.io images import "$a" >/dev/null ||
				die "importing $a into $C-$n"
		done
	done <"$S/nodes.list"
}

main() {
	local cmd=${1:-}
	shift || true
	case $cmd in
	up)
		(($# >= 2)) || die "usage: cluster.sh up NAME INDEX [NODE...]"
		up "$@"
		;;
	down)
		(($# == 1)) || die "usage: cluster.sh down NAME"
		down "$1"
		;;
	import)
		(($# >= 2)) || die "usage: cluster.sh import NAME ARCHIVE..."
		import "$@"
		;;
	nodeexec)
		(($# >= 3)) || die "usage: cluster.sh nodeexec NAME NODE CMD..."
		cluster_vars "$1"
		local node=$2
		shift 2
		nodeexec "$node" "$@"
		;;
	check)
		check_tools
		;;
	rss)
		(($# == 1)) || die "usage: cluster.sh rss NAME"
		cluster_vars "$1"
		rss
		;;
	_node_run)
		cluster_vars "$1"
		node_run "$2" "$3"
		;;
	*)
		die "usage: cluster.sh up|down|import|nodeexec|rss|check ..."
		;;
	esac
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
	main "$@"
fi
