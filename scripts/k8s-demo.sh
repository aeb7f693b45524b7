#!/usr/bin/env bash
# `make k8s-demo`: two real Kubernetes clusters, east and west, on this machine (tests/k8s/cluster.sh:
# upstream v1.37 control planes and kubelets in network namespaces), a cable-broker, and the agent
# installed in each cluster exactly as the README says:
#   cablectl install kubernetes ... | kubectl apply -f -
#   kubectl label node NODE cablemesh.io/gateway=true
# It waits until each cluster's agent pod is Running and Ready on its gateway node, prints the
# kubeconfig of each cluster and the broker's admin credential, and leaves everything running.
# Tear down with: make k8s-demo-down (scripts/k8s-demo-down.sh). Running it again first tears down.
#
# Addresses: the underlay bridge ck8ul holds 172.29.0.1/24 in the host's network namespace (the
# host's foothold, so kubectl and cablectl work from here), the broker is 172.29.0.2 in namespace
# ck8-broker, the gateways' second links are 172.29.0.1<I>; cluster I's nodes are 172.29.<I>.0/24
# and each gateway routes the other cluster's node network over the underlay. Pod CIDRs
# 10.1.0.0/16 (east) and 10.2.0.0/16 (west), service CIDRs 10.96.1.0/24 and 10.96.2.0/24.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CABLEMESH_BIN:-$ROOT/bin}
export CABLEMESH_K8S_DIR=${CABLEMESH_K8S_DIR:-/tmp/cablemesh-k8s}
STATE=$CABLEMESH_K8S_DIR
CLUSTER=$ROOT/tests/k8s/cluster.sh
UL=ck8ul
BRK_NS=ck8-broker
BROKER_IP=172.29.0.2
BROKER=$BROKER_IP:7443
CLUSTERS=(east west)

say() { printf '%s k8s-demo: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { say "error: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "run as root (it creates network namespaces, mounts and cgroups)"
for b in cable-broker cable-agent cablectl; do
	[[ -x $BIN/$b ]] || die "$BIN/$b is missing; run 'make build' (or 'make k8s-demo')"
done

"$CLUSTER" check
start=$SECONDS
"$ROOT/scripts/k8s-demo-down.sh" >/dev/null
mkdir -p "$STATE/images" "$STATE/broker"
chmod 700 "$STATE"

say "Kubernetes binaries (tests/k8s/build.sh: reused from the cache, or built: 15-30 minutes cold)"
K8S_BIN=$("$ROOT/tests/k8s/build.sh")
export K8S_BIN
[[ -x $K8S_BIN/kube-proxy ]] || die "$K8S_BIN/kube-proxy is missing: the agent reaches the API server through the kubernetes Service"
KUBECTL=$K8S_BIN/kubectl

say "the agent's image (scripts/image.sh, as make image), exported for the nodes' containerd (they import $STATE/images/*.tar at start)"
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
"$ROOT/scripts/image.sh" >/dev/null
# A docker-archive keeps the full repo tag, under which the CRI looks the image up
# (cablemesh/cable-agent:v0.1.0 is docker.io/cablemesh/cable-agent:v0.1.0 to it).
buildah push --quiet cablemesh/cable-agent:v0.1.0 \
	"docker-archive:$STATE/images/cable-agent.tar:docker.io/cablemesh/cable-agent:v0.1.0" >/dev/null

say "CoreDNS (tests/k8s/coredns/build.sh: reused from the cache, or built: about 3 minutes cold) and its image"
COREDNS_DIR=$("$ROOT/tests/k8s/coredns/build.sh" image)
ln -sf "$COREDNS_DIR/coredns.tar" "$STATE/images/coredns.tar"

say "underlay $UL (172.29.0.0/24) and cable-broker at $BROKER (namespace $BRK_NS)"
ip link add "$UL" type bridge
ip addr add 172.29.0.1/24 dev "$UL"
ip link set "$UL" up
ip netns add "$BRK_NS"
ip -n "$BRK_NS" link set lo up
ip link add ck0brk type veth peer name eth0 netns "$BRK_NS"
ip link set ck0brk master "$UL" up
ip -n "$BRK_NS" addr add "$BROKER_IP/24" dev eth0
ip -n "$BRK_NS" link set eth0 up
setsid nsenter --net="/run/netns/$BRK_NS" "$BIN/cable-broker" --data-dir "$STATE/broker" --listen "$BROKER" \
	>>"$STATE/broker.log" 2>&1 </dev/null &
echo $! >"$STATE/broker.pid"
ADMIN=$STATE/broker/admin.yaml
for _ in $(seq 1 150); do
	[[ -f $ADMIN ]] && "$BIN/cablectl" --config "$ADMIN" cluster list >/dev/null 2>&1 && break
	sleep 0.2
done
"$BIN/cablectl" --config "$ADMIN" cluster list >/dev/null || {
	tail -n 30 "$STATE/broker.log" >&2
	die "the broker did not come up"
}

i=1
for c in "${CLUSTERS[@]}"; do
	say "cluster $c: control plane and nodes $c-gw, $c-worker"
	"$CLUSTER" up "$c" "$i" gw worker
	i=$((i + 1))
done

# gateway_underlay NAME INDEX: the gateway node's second link, on the underlay, and routes to the
# other clusters' node networks (their gateways' InternalIPs, which the agents advertise).
gateway_underlay() {
	local c=$1 idx=$2 ns=ck8-$1-gw j
	ip link add "ck${idx}ul" type veth peer name ul0 netns "$ns"
	ip link set "ck${idx}ul" master "$UL" up
	ip -n "$ns" addr add "172.29.0.1$idx/24" dev ul0
	ip -n "$ns" link set ul0 up
	# From the node's InternalIP, the address the agents advertise: a WireGuard peer that saw the
	# underlay address instead would roam there and the agent would set it back every 30 s.
	for ((j = 1; j <= ${#CLUSTERS[@]}; j++)); do
		((j == idx)) && continue
		ip -n "$ns" route add "172.29.$j.0/24" via "172.29.0.1$j" src "172.29.$idx.11"
	done
	# The worker reaches the broker through its gateway (as a real node through its default
	# route), and the broker answers the cluster's node network the same way back.
	ip -n "ck8-$c-worker" route add 172.29.0.0/24 via "172.29.$idx.11"
	ip -n "$BRK_NS" route add "172.29.$idx.0/24" via "172.29.0.1$idx"
}
i=1
for c in "${CLUSTERS[@]}"; do
	gateway_underlay "$c" "$i"
	i=$((i + 1))
done

# demo_apps CLUSTER: make demo's workload in namespace demo: web answering "hello from CLUSTER"
# and exported, and two pods of the probe image to call from, one on each node (their /call
# resolves through the pod's resolv.conf, i.e. cluster DNS).
demo_apps() {
	local c=$1 pod node gw
	cat <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: demo}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: docker.io/cablemesh/k8s-probe:test
        imagePullPolicy: Never
        args: [serve, -text, hello from $c]
        readinessProbe: {tcpSocket: {port: 80}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: {name: web, namespace: demo}
YAML
	for pod in client client-worker; do
		if [[ $pod == client ]]; then node=$c-gw gw=true; else node=$c-worker gw=false; fi
		cat <<YAML
---
apiVersion: v1
kind: Pod
metadata: {name: $pod, namespace: demo}
spec:
  nodeSelector: {cablemesh.io/gateway: "$gw"}
  containers:
  - {name: client, image: docker.io/cablemesh/k8s-probe:test, imagePullPolicy: Never, args: [serve, -text, "$pod of $c on $node"]}
YAML
	done
}

agent_ready() {
	local kc=$STATE/$1/kubeconfig
	[[ $("$KUBECTL" --kubeconfig "$kc" -n cablemesh get pods -l 'app.kubernetes.io/name in (cable-agent,cable-agent-worker)' \
		-o jsonpath='{range .items[*]}{.spec.nodeName}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null | sort) == "$1-gw=True"$'\n'"$1-worker=True" ]]
}

# What the nodes of these clusters need beyond the install's manifests (tests/k8s/cmd/nodeagents):
# the clusterset.local DNS server the test pods ask (dns.listen, port 53: the DaemonSets grant
# NET_BIND_SERVICE), and on a hybrid cgroup host the node's cgroup2 as the DaemonSets mount it
# (/sys/fs/cgroup/unified). The install itself runs the gateway's agent on the node labelled
# cablemesh.io/gateway=true and a worker agent on every other node.
NODEAGENTS_ARGS=(-dns-listen 0.0.0.0:53)
if [[ $(stat -f -c %T /sys/fs/cgroup) == tmpfs && $(stat -f -c %T /sys/fs/cgroup/unified 2>/dev/null) == cgroup2fs ]]; then
	NODEAGENTS_ARGS+=(-cgroup-path /host/sys/fs/cgroup/unified)
fi
(cd "$ROOT/tests/k8s" && go build -mod=readonly -o "$STATE/nodeagents" ./cmd/nodeagents)
echo "${NODEAGENTS_ARGS[*]}" >"$STATE/nodeagents.args"

i=1
for c in "${CLUSTERS[@]}"; do
	kc=$STATE/$c/kubeconfig
	say "cluster $c: cablectl install kubernetes ... | nodeagents ${NODEAGENTS_ARGS[*]} | kubectl apply -f -"
	"$KUBECTL" --kubeconfig "$kc" label node "$c-gw" cablemesh.io/gateway=true
	"$KUBECTL" --kubeconfig "$kc" label node "$c-worker" cablemesh.io/gateway=false
	if [[ " ${CABLEMESH_K8S_HELM:-} " == *" $c "* ]]; then # installed with the Helm chart instead (TestHelm)
		BROKER=$BROKER "$ROOT/tests/k8s/helm-install.sh" "$c" "$i"
	else
		"$BIN/cablectl" --config "$ADMIN" install kubernetes --cluster "$c" --pod-cidr "10.$i.0.0/16" \
			--service-cidr "10.96.$i.0/24" --agent-broker "$BROKER" | "$STATE/nodeagents" "${NODEAGENTS_ARGS[@]}" |
			"$KUBECTL" --kubeconfig "$kc" apply -f -
	fi
	i=$((i + 1))
done
for c in "${CLUSTERS[@]}"; do
	say "cluster $c: waiting for the agent pods to be Ready on $c-gw and $c-worker"
	deadline=$((SECONDS + 180))
	until agent_ready "$c"; do
		if ((SECONDS >= deadline)); then
			"$KUBECTL" --kubeconfig "$STATE/$c/kubeconfig" -n cablemesh get pods -o wide >&2 || true
			"$KUBECTL" --kubeconfig "$STATE/$c/kubeconfig" -n cablemesh logs ds/cable-agent --tail 30 >&2 || true
			die "the agent of $c is not Ready after 180s"
		fi
		sleep 1
	done
done

# Cluster DNS: CoreDNS forwarding clusterset.local to the agents, as docs/services.md tells
# operators; then the demo's workload (unless CABLEMESH_K8S_DEMO_APPS=0: the k8s tests bring
# their own).
i=1
dns_pids=()
for c in "${CLUSTERS[@]}"; do
	"$ROOT/tests/k8s/coredns/cluster-dns.sh" "$c" "$i" forward &
	dns_pids+=($!)
	i=$((i + 1))
done
for p in "${dns_pids[@]}"; do
	wait "$p" || die "cluster DNS did not come up (tests/k8s/coredns/cluster-dns.sh)"
done
if [[ ${CABLEMESH_K8S_DEMO_APPS:-1} != 0 ]]; then
	for c in "${CLUSTERS[@]}"; do
		say "cluster $c: namespace demo: web (exported), client on $c-gw, client-worker on $c-worker"
		demo_apps "$c" | "$KUBECTL" --kubeconfig "$STATE/$c/kubeconfig" apply -f - >/dev/null
	done
	for c in "${CLUSTERS[@]}"; do
		"$KUBECTL" --kubeconfig "$STATE/$c/kubeconfig" -n demo wait --for condition=Ready pod --all --timeout 120s >/dev/null ||
			die "the demo pods of $c are not Ready after 120s"
	done
fi

for c in "${CLUSTERS[@]}"; do
	echo
	echo "== kubectl --kubeconfig $STATE/$c/kubeconfig get nodes,pods -A -o wide"
	"$KUBECTL" --kubeconfig "$STATE/$c/kubeconfig" get nodes -o wide
	"$KUBECTL" --kubeconfig "$STATE/$c/kubeconfig" get pods -A -o wide
done
echo
echo "== cablectl --config $ADMIN cluster list"
"$BIN/cablectl" --config "$ADMIN" cluster list

cat <<EOF

The Kubernetes demo is up after $((SECONDS - start))s (state and logs in $STATE).
  east kubeconfig:    $STATE/east/kubeconfig
  west kubeconfig:    $STATE/west/kubeconfig
  broker admin:       $ADMIN   (cablectl --config $ADMIN ...)
  kubectl:            $KUBECTL
Try:  $KUBECTL --kubeconfig $STATE/east/kubeconfig -n demo exec client -- /call web.demo.svc.clusterset.local:80
      $KUBECTL --kubeconfig $STATE/east/kubeconfig -n demo exec client-worker -- /call web.demo.svc.clusterset.local:80
      $KUBECTL --kubeconfig $STATE/east/kubeconfig -n cablemesh logs ds/cable-agent
      $ROOT/tests/k8s/cluster.sh nodeexec east gw ip addr
Tear it down with:  make k8s-demo-down
EOF
