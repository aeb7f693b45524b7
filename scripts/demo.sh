#!/usr/bin/env bash
# Starts a demo mesh on this machine: cable-broker and three clusters (east, west, north), each a
# gateway node running cable-agent and a pod behind it, all in network namespaces named cbldemo-*
# joined by a bridge in their own underlay namespace (nothing touches the host's network
# namespace). Waits until every tunnel is connected, pings across, prints `cablectl status` of
# each gateway, then shows a service exported by east and west called by name from north (DNS and
# a TCP request through the clusterset VIP), and leaves everything running. Tear down with:
# make demo-down
# Running it again first tears down the previous demo.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${CABLEMESH_BIN:-$ROOT/bin}
STATE=${CABLEMESH_DEMO_DIR:-/tmp/cablemesh-demo}
P=cbldemo-
UL=${P}ul
BRK=${P}brk
BROKER_IP=172.31.0.1
BROKER=$BROKER_IP:7443
CLUSTERS=(east=10.1.0.0/16 west=10.2.0.0/16 north=10.3.0.0/16)

if [ "$(id -u)" -ne 0 ]; then
	echo "demo: run as root (it creates network namespaces)" >&2
	exit 1
fi
# The programs the demo runs (scripts/deps.list, stage demo): name what is missing, up front.
"$ROOT/scripts/install-deps.sh" --check demo || exit 1
for b in cable-broker cable-agent cablectl; do
	if [ ! -x "$BIN/$b" ]; then
		echo "demo: $BIN/$b is missing; run 'make build' (or 'make demo')" >&2
		exit 1
	fi
done

say() { printf '%s demo: %s\n' "$(date -u +%H:%M:%S)" "$*"; }

"$ROOT/scripts/demo-down.sh" >/dev/null
mkdir -p "$STATE"
chmod 700 "$STATE"

# The services datapath: the demo's own bpffs for the agents' pins, and a cgroup per gateway
# (bind-mounted into the state dir) that its eBPF socket hooks attach to. Both lie outside /sys,
# which `ip netns exec` remounts. The pods' clients run in their gateway's cgroup.
CGROOT=""
for r in /sys/fs/cgroup/unified /sys/fs/cgroup; do
	if [ "$(stat -f -c %T "$r" 2>/dev/null)" = cgroup2fs ]; then CGROOT=$r; break; fi
done
if [ -z "$CGROOT" ]; then
	echo "demo: needs cgroup2 mounted at /sys/fs/cgroup or /sys/fs/cgroup/unified" >&2
	exit 1
fi
mkdir -p "$STATE/bpffs"
mount -t bpf bpf "$STATE/bpffs"
say "building the demo's service program (tcpcheck)"
# In the background, while the namespaces and the broker come up; waited for before the pods.
(cd "$ROOT" && go build -o "$STATE/tcpcheck" ./tests/netns/cmd/tcpcheck) &
tcpcheck_build=$!

# in_pod NAME CMD...: CMD in the pod namespace of cluster NAME, inside its gateway's cgroup.
in_pod() {
	local name=$1
	shift
	sh -c 'echo $$ > "$0" && exec "$@"' "$CGROOT/${P}${name}-gw/cgroup.procs" ip netns exec "${P}${name}-pod" "$@"
}


# start NS LOG CMD...: runs CMD inside NS in the background, detached from this shell.
start() {
	local ns=$1 log=$2
	shift 2
	setsid ip netns exec "$ns" "$@" >>"$log" 2>&1 </dev/null &
	echo $! >>"$STATE/pids"
}

# cidr_host CIDR N: the Nth address of an IPv4 CIDR's first /24 (N < 255).
cidr_host() {
	local net=${1%/*}
	echo "${net%.*}.$2"
}

netns_add() {
	ip netns add "$1"
	ip -n "$1" link set lo up
}

# attach NS INDEX ADDR: veth u<INDEX> on the underlay bridge <-> eth0 in NS.
attach() {
	ip -n "$UL" link add "u$2" type veth peer name eth0 netns "$1"
	ip -n "$UL" link set "u$2" master br0 up
	ip -n "$1" addr add "$3/24" dev eth0
	ip -n "$1" link set eth0 up
}

say "underlay and broker namespaces (${P}*)"
netns_add "$UL"
ip -n "$UL" link add br0 type bridge
ip -n "$UL" link set br0 up
netns_add "$BRK"
attach "$BRK" 1 "$BROKER_IP"

say "cable-broker --data-dir $STATE/broker --listen $BROKER"
start "$BRK" "$STATE/broker.log" "$BIN/cable-broker" --data-dir "$STATE/broker" --listen "$BROKER"
ADMIN=$STATE/broker/admin.yaml
for _ in $(seq 1 150); do
	if [ -f "$ADMIN" ] && ip netns exec "$BRK" "$BIN/cablectl" --config "$ADMIN" cluster list >/dev/null 2>&1; then
		break
	fi
	sleep 0.2
done
ip netns exec "$BRK" "$BIN/cablectl" --config "$ADMIN" cluster list >/dev/null || {
	echo "demo: the broker did not come up; its log:" >&2
	tail -n 30 "$STATE/broker.log" >&2
	exit 1
}

wait "$tcpcheck_build" || { echo "demo: building tests/netns/cmd/tcpcheck failed" >&2; exit 1; }

idx=10
for spec in "${CLUSTERS[@]}"; do
	name=${spec%%=*}
	cidr=${spec#*=}
	gw=${P}${name}-gw
	pod=${P}${name}-pod
	dir=$STATE/$name
	mkdir -p "$dir"
	gw_ip=172.31.0.$idx
	say "cluster $name: pod CIDR $cidr, gateway $gw ($gw_ip), pod $pod ($(cidr_host "$cidr" 10))"
	netns_add "$gw"
	netns_add "$pod"
	attach "$gw" "$idx" "$gw_ip"
	ip -n "$gw" link add pod0 type veth peer name eth0 netns "$pod"
	ip -n "$gw" addr add "$(cidr_host "$cidr" 1)/24" dev pod0
	ip -n "$gw" link set pod0 up
	ip -n "$pod" addr add "$(cidr_host "$cidr" 10)/24" dev eth0
	ip -n "$pod" link set eth0 up
	ip -n "$pod" route add default via "$(cidr_host "$cidr" 1)"
	ip netns exec "$gw" sysctl -q -w net.ipv4.ip_forward=1

	ip netns exec "$BRK" "$BIN/cablectl" --config "$ADMIN" cluster join-token "$name" --pod-cidr "$cidr" >"$dir/join-token"
	chmod 600 "$dir/join-token"
	mkdir -p "$CGROOT/${P}${name}-gw" "$dir/cgroup"
	mount --bind "$CGROOT/${P}${name}-gw" "$dir/cgroup"
	# The pod resolves names through its gateway's agent (ip netns exec binds this file).
	mkdir -p "/etc/netns/${pod}"
	echo "nameserver $(cidr_host "$cidr" 1)" >"/etc/netns/${pod}/resolv.conf"
	exports=""
	if [ "$name" != north ]; then
		exports="exports:
- {name: web, namespace: demo, ports: [{name: http, port: 80, protocol: TCP}], endpoints: [{ip: $(cidr_host "$cidr" 10)}]}"
		start "$pod" "$STATE/web-$name.log" "$STATE/tcpcheck" hello -listen :80 -reply "hello from $name"
	fi
	cat >"$dir/agent.yaml" <<YAML
cluster: $name
node: $name-gw1
broker: $BROKER
joinTokenFile: $dir/join-token
stateDir: $dir/state
gateway: true
advertiseAddress: $gw_ip
podCIDRs: [$cidr]
statusSocket: $dir/agent.sock
wireguard: {interface: cbl-wg0, port: 51820}
cgroupPath: $dir/cgroup
bpfPinDir: $STATE/bpffs/$name
dns: {listen: "$(cidr_host "$cidr" 1):53"}
$exports
YAML
	start "$gw" "$STATE/agent-$name.log" "$BIN/cable-agent" --config "$dir/agent.yaml"
	idx=$((idx + 1))
done

# connected NAME: true when NAME's agent reports every other demo cluster connected.
connected() {
	local out want
	out=$("$BIN/cablectl" status --socket "$STATE/$1/agent.sock" -o json 2>/dev/null) || return 1
	want=$((${#CLUSTERS[@]} - 1))
	[ "$(grep -Eo '"state": *"connected"' <<<"$out" | wc -l)" -ge "$want" ]
}

say "waiting for every tunnel to be connected"
deadline=$((SECONDS + 120))
while :; do
	all=1
	nudges=()
	for spec in "${CLUSTERS[@]}"; do
		name=${spec%%=*}
		if ! connected "$name"; then
			all=0
			# WireGuard hands shake on traffic: nudge each peer (all at once).
			for other in "${CLUSTERS[@]}"; do
				[ "${other%%=*}" = "$name" ] && continue
				ip netns exec "${P}${name}-pod" ping -n -q -c 1 -W 1 "$(cidr_host "${other#*=}" 10)" >/dev/null 2>&1 &
				nudges+=($!)
			done
		fi
	done
	[ ${#nudges[@]} -eq 0 ] || wait "${nudges[@]}" || true
	[ $all = 1 ] && break
	if [ $SECONDS -ge $deadline ]; then
		echo "demo: not every tunnel connected after 120s; agent logs are in $STATE/agent-*.log" >&2
		exit 1
	fi
	sleep 0.2
done
say "connected after ${SECONDS}s"

# Every pod pings every other at once (each pair's result in its own file), then the results
# are printed in order.
mkdir -p "$STATE/ping"
pairs=()
pingers=()
for spec in "${CLUSTERS[@]}"; do
	name=${spec%%=*}
	for other in "${CLUSTERS[@]}"; do
		[ "${other%%=*}" = "$name" ] && continue
		pairs+=("$name ${other%%=*} $(cidr_host "${other#*=}" 10)")
		ip netns exec "${P}${name}-pod" ping -n -q -c 3 -i 0.2 -W 1 "$(cidr_host "${other#*=}" 10)" \
			>"$STATE/ping/$name-${other%%=*}" 2>&1 &
		pingers+=($!)
	done
done
# Only the pings: the broker and the agents are children of this shell too.
wait "${pingers[@]}" || true
lost=0
for pair in "${pairs[@]}"; do
	read -r name other dst <<<"$pair"
	result=$(grep -o '[0-9]* received.*' "$STATE/ping/$name-$other") || result="no reply: $(tail -n 1 "$STATE/ping/$name-$other")"
	case $result in 0\ received* | no\ reply*) lost=1 ;; esac
	printf '%s pod -> %s pod (%s): %s\n' "$name" "$other" "$dst" "$result"
done
if [ $lost = 1 ]; then
	echo "demo: a pod could not reach another; agent logs are in $STATE/agent-*.log" >&2
	exit 1
fi

for spec in "${CLUSTERS[@]}"; do
	name=${spec%%=*}
	echo
	echo "== cablectl status --socket $STATE/$name/agent.sock   (gateway of $name)"
	"$BIN/cablectl" status --socket "$STATE/$name/agent.sock"
done

say "services: east and west export demo/web (TCP 80); north calls it by name"
deadline=$((SECONDS + 60))
until "$BIN/cablectl" status --socket "$STATE/north/agent.sock" -o json 2>/dev/null | grep -q '"10.2.0.10:80/tcp"'; do
	if [ $SECONDS -ge $deadline ]; then
		echo "demo: north never got demo/web's backends; see $STATE/agent-north.log" >&2
		exit 1
	fi
	sleep 0.2
done
echo
echo "== dig web.demo.svc.clusterset.local (from north's pod, through its gateway agent's DNS)"
ip netns exec "${P}north-pod" dig +noall +answer web.demo.svc.clusterset.local A
ip netns exec "${P}north-pod" dig +noall +answer _http._tcp.web.demo.svc.clusterset.local SRV
echo
echo "== TCP requests to web.demo.svc.clusterset.local:80 from north's pod (through the VIP)"
for _ in 1 2 3 4 5 6; do
	in_pod north "$STATE/tcpcheck" ask -addr web.demo.svc.clusterset.local:80 -timeout 2s
done
echo
echo "== cablectl service list"
ip netns exec "$BRK" "$BIN/cablectl" --config "$ADMIN" service list
echo
echo "== cablectl status --socket $STATE/north/agent.sock   (north's services section)"
"$BIN/cablectl" status --socket "$STATE/north/agent.sock" | sed -n '/^Services:/,$p'

cat <<EOF

The demo mesh is running (namespaces ${P}*, state and logs in $STATE).
Try:  ip netns exec ${P}east-pod ping -c 3 $(cidr_host 10.2.0.0/16 10)
      $BIN/cablectl status --socket $STATE/east/agent.sock -o json
      ip netns exec $BRK $BIN/cablectl --config $ADMIN cluster list
      ip netns exec ${P}north-pod dig web.demo.svc.clusterset.local
      $BIN/cablectl service export api -n demo --port http:80/TCP --endpoint 10.1.0.10 --socket $STATE/east/agent.sock
Tear it down with:  make demo-down
EOF
