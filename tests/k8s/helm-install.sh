#!/usr/bin/env bash
# helm-install.sh CLUSTER INDEX: installs Cablemesh in one cluster of scripts/k8s-demo.sh with the
# Helm chart deploy/helm/cablemesh instead of `cablectl install kubernetes | kubectl apply`, as an
# operator would (docs/helm.md): a join token from the broker, `helm install` with the cluster's
# values, the token's Secret in the namespace the chart made. k8s-demo.sh runs it for the
# clusters named in CABLEMESH_K8S_HELM (TestHelm sets it); it reads k8s-demo.sh's state directory
# (CABLEMESH_K8S_DIR) and the broker address BROKER, and leaves waiting for the agents to
# k8s-demo.sh. The nodes' test-only agent config values (nodeagents.args: dns.listen, cgroupPath)
# go in through Helm's post-renderer, the same nodeagents filter the cablectl install goes
# through. The helm binary comes from tests/helm/build.sh (built once, cached).
set -euo pipefail

c=$1 i=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${CABLEMESH_BIN:-$ROOT/bin}
STATE=${CABLEMESH_K8S_DIR:?}
: "${BROKER:?BROKER: the broker address (host:port) of k8s-demo.sh}"
ADMIN=$STATE/broker/admin.yaml
kc=$STATE/$c/kubeconfig
KUBECTL=${K8S_BIN:?}/kubectl
HELM=$("$ROOT/tests/helm/build.sh")/helm

# The same values k8s-demo.sh gives cablectl install kubernetes.
cat >"$STATE/$c/helm-values.yaml" <<VALUES
cluster: $c
broker: "$BROKER"
podCIDRs: [10.$i.0.0/16]
serviceCIDRs: [10.96.$i.0/24]
VALUES

# nodeagents' arguments, each as --post-renderer-args=ARG (they start with '-').
read -r -a args <"$STATE/nodeagents.args"
post=(--post-renderer "$STATE/nodeagents")
for a in "${args[@]}"; do post+=("--post-renderer-args=$a"); done

# The release's record lives in the default namespace; the chart's objects in cablemesh, which
# the chart creates (as cablectl's install does), so the Secret comes right after: the agents'
# pods wait for it to mount.
"$HELM" --kubeconfig "$kc" --namespace default install cablemesh "$ROOT/deploy/helm/cablemesh" \
	--values "$STATE/$c/helm-values.yaml" "${post[@]}"
token=$(mktemp "$STATE/$c/join-token.XXXXXX")
trap 'rm -f "$token"' EXIT
# Both nodes run an agent (the gateway and the worker), each joining with this token.
"$BIN/cablectl" --config "$ADMIN" cluster join-token "$c" --pod-cidr "10.$i.0.0/16" \
	--service-cidr "10.96.$i.0/24" --max-nodes 2 >"$token"
"$KUBECTL" --kubeconfig "$kc" -n cablemesh create secret generic cable-join-token --from-file=join-token="$token"
