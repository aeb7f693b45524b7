#!/usr/bin/env bash
# Cluster DNS for a cluster of tests/k8s/cluster.sh: CoreDNS (the image of build.sh) as the
# Deployment and Service kube-system/kube-dns at the kubelets' clusterDNS (10.96.<INDEX>.10),
# serving cluster.local with the kubernetes plugin and clusterset.local in one of two modes:
#
#   cluster-dns.sh CLUSTER INDEX forward        clusterset.local forwarded to the agents'
#       dns.listen through the Service cablemesh/cable-agent-dns (ClusterIP 10.96.<INDEX>.53),
#       the Service and the Corefile stanza of docs/services.md;
#   cluster-dns.sh CLUSTER INDEX multicluster   clusterset.local answered by CoreDNS itself from
#       the ServiceImports and EndpointSlices the agents' elected writer keeps (the kubernetes
#       plugin's `multicluster` option, KEP-1645's DNS), no forwarding.
#
# Applying it again with the other mode replaces the Corefile and restarts CoreDNS. It waits until
# CoreDNS is Ready. The image must be on the nodes already (cluster.sh imports
# $CABLEMESH_K8S_DIR/images/*.tar at node start; scripts/k8s-demo.sh puts build.sh's archive
# there). Needs $K8S_BIN (kubectl) and the cluster's kubeconfig under $CABLEMESH_K8S_DIR.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
state=${CABLEMESH_K8S_DIR:-/tmp/cablemesh-k8s}
log() { printf '%s cluster-dns: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

(($# == 3)) || die "usage: cluster-dns.sh CLUSTER INDEX forward|multicluster"
cluster=$1 index=$2 mode=$3
[[ $index =~ ^[1-9][0-9]?$ ]] || die "INDEX '$index' must be an integer from 1 to 99"
[[ $mode == forward || $mode == multicluster ]] || die "mode '$mode' must be forward or multicluster"
kubeconfig=$state/$cluster/kubeconfig
[[ -f $kubeconfig ]] || die "cluster $cluster is not up (no $kubeconfig)"
[[ -x ${K8S_BIN:-}/kubectl ]] || die "K8S_BIN must name the directory of kubectl (tests/k8s/build.sh prints it)"
kc() { "$K8S_BIN/kubectl" --kubeconfig "$kubeconfig" "$@"; }

version=$(cd "$here" && go list -mod=readonly -m -f '{{.Version}}' github.com/coredns/coredns)
dns_ip=10.96.$index.10
agent_dns_ip=10.96.$index.53

# The Corefiles. Only cluster.local, its reverse zones and clusterset.local are served: the
# nodes here have no upstream resolver, so every other name is refused rather than forwarded.
# Queries for clusterset.local are logged (the k8s test reads them: the pods' names went through
# CoreDNS).
corefile_forward="\
.:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    loadbalance
}
clusterset.local:53 {
    errors
    log
    cache 5
    loadbalance
    forward . $agent_dns_ip
}"
corefile_multicluster="\
.:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    log clusterset.local
    kubernetes cluster.local clusterset.local in-addr.arpa ip6.arpa {
        multicluster clusterset.local
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
    loadbalance
}"
if [[ $mode == forward ]]; then corefile=$corefile_forward; else corefile=$corefile_multicluster; fi

# The agents' DNS behind one ClusterIP: both DaemonSets' pods (hostNetwork, dns.listen
# 0.0.0.0:53). Only the forward mode uses it.
agent_service=""
if [[ $mode == forward ]]; then
	agent_service="---
apiVersion: v1
kind: Service
metadata:
  name: cable-agent-dns
  namespace: cablemesh
spec:
  clusterIP: $agent_dns_ip
  selector:
    app.kubernetes.io/part-of: cablemesh
  ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, protocol: TCP}"
fi

log "cluster $cluster: CoreDNS $version at $dns_ip, clusterset.local by $mode"
kc apply -f - >/dev/null <<YAML
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
  - apiGroups: [""]
    resources: [services, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
  - apiGroups: [multicluster.x-k8s.io]
    resources: [serviceimports]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
$(sed 's/^/    /' <<<"$corefile")
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata:
      labels: {k8s-app: kube-dns}
      annotations: {cablemesh.io/clusterset-dns: $mode}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      tolerations: [{operator: Exists, effect: NoSchedule}]
      containers:
        - name: coredns
          image: docker.io/cablemesh/coredns:$version
          imagePullPolicy: Never
          args: [-conf, /etc/coredns/Corefile]
          ports:
            - {name: dns, containerPort: 53, protocol: UDP}
            - {name: dns-tcp, containerPort: 53, protocol: TCP}
          readinessProbe:
            httpGet: {path: /ready, port: 8181}
            periodSeconds: 1
          livenessProbe:
            httpGet: {path: /health, port: 8080}
            periodSeconds: 10
          resources:
            limits: {memory: 170Mi}
            requests: {cpu: 10m, memory: 70Mi}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
          volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes:
        - name: config
          configMap: {name: coredns, items: [{key: Corefile, path: Corefile}]}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns}
spec:
  clusterIP: $dns_ip
  selector: {k8s-app: kube-dns}
  ports:
    - {name: dns, port: 53, protocol: UDP}
    - {name: dns-tcp, port: 53, protocol: TCP}
$agent_service
YAML
if [[ $mode == multicluster ]]; then
	kc -n cablemesh delete service cable-agent-dns --ignore-not-found >/dev/null
fi
# The pod template's annotation names the mode, so a mode change rolls the Deployment; the same
# mode again changes nothing (a Corefile edit alone would wait for the kubelet's ConfigMap sync
# and a reload plugin, which these Corefiles do not use).
kc -n kube-system rollout status deployment/coredns --timeout 120s >/dev/null ||
	{
		kc -n kube-system get pods -l k8s-app=kube-dns -o wide >&2 || true
		kc -n kube-system logs deployment/coredns --tail 30 >&2 || true
		die "CoreDNS of $cluster is not Ready after 120s"
	}
log "cluster $cluster: CoreDNS Ready ($mode)"
