package kube

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/mcs"
)

// AnnotationAffinity on a ServiceExport sets the export's affinity: local (the default) or none
// (mcs.AffinityLocal, mcs.AffinityNone). Any other value makes the export invalid.
const AnnotationAffinity = "cablemesh.io/affinity"

// The MCS Valid condition on a ServiceExport, and its reasons (sigs.k8s.io/mcs-api v1alpha1, with
// InvalidExport added for what the Service allows but Cablemesh refuses).
const (
	ConditionValid           = string(mcsv1a1.ServiceExportConditionValid)
	ReasonValid              = string(mcsv1a1.ServiceExportReasonValid)
	ReasonNoService          = string(mcsv1a1.ServiceExportReasonNoService)
	ReasonInvalidServiceType = string(mcsv1a1.ServiceExportReasonInvalidServiceType)
	ReasonInvalidExport      = "InvalidExport"
)

// Validity is the verdict on one ServiceExport: valid, or not with a reason (one of the Reason
// constants) and a message for the operator. It becomes the ServiceExport's Valid condition.
type Validity struct {
	Valid   bool
	Reason  string
	Message string
}

// Export computes what the ServiceExport se of cluster comes to, from the Service of the same
// namespace/name (nil when there is none) and that Service's EndpointSlices (those labelled
// kubernetes.io/service-name=<name> in its namespace; others are ignored). It returns the
// normalized export and a valid verdict, or nil and the reason there is no export.
//
// The export's type is Headless when the Service's clusterIP is None, else ClusterSetIP; its ports
// are the Service's ports; its labels are the ServiceExport's labels, overlaid by its
// spec.exportedLabels (the MCS field for exactly this); its affinity is the cablemesh.io/affinity
// annotation. Each EndpointSlice endpoint contributes its first address (as kube-proxy does: the
// API gives further addresses no meaning), ready unless conditions.ready is false (nil means
// ready), with its hostname. An address in several slices (as during a slice rebalance) is one
// endpoint, ready if any of its copies is. Export is pure: it neither changes its arguments nor
// does I/O.
func Export(cluster string, se *mcsv1a1.ServiceExport, svc *corev1.Service, epSlices []*discoveryv1.EndpointSlice) (*apiv1.ServiceExport, Validity) {
	key := mcs.Key(se.Namespace, se.Name)
	if svc == nil {
		return nil, Validity{Reason: ReasonNoService, Message: fmt.Sprintf("Service %s not found", key)}
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil, Validity{Reason: ReasonInvalidServiceType,
			Message: fmt.Sprintf("Service %s is of type %s, which cannot be exported", key, corev1.ServiceTypeExternalName)}
	}
	affinity, set := se.Annotations[AnnotationAffinity]
	if set && affinity != mcs.AffinityLocal && affinity != mcs.AffinityNone {
		return nil, Validity{Reason: ReasonInvalidExport,
			Message: fmt.Sprintf("annotation %s: %q is not %s or %s", AnnotationAffinity, affinity, mcs.AffinityLocal, mcs.AffinityNone)}
	}
	e := &apiv1.ServiceExport{
		Cluster:   cluster,
		Namespace: se.Namespace,
		Name:      se.Name,
		Type:      mcs.TypeClusterSetIP,
		Affinity:  affinity,
		Labels:    exportLabels(se),
		Ports:     ports(svc, epSlices),
		Endpoints: endpoints(se.Namespace, se.Name, epSlices),
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		e.Type = mcs.TypeHeadless
	}
	if err := mcs.Normalize("export", e); err != nil {
		return nil, Validity{Reason: ReasonInvalidExport, Message: err.Error()}
	}
	return e, Validity{Valid: true, Reason: ReasonValid, Message: "exported as " + e.Type}
}

func exportLabels(se *mcsv1a1.ServiceExport) map[string]string {
	if len(se.Labels) == 0 && len(se.Spec.ExportedLabels) == 0 {
		return nil
	}
	l := make(map[string]string, len(se.Labels)+len(se.Spec.ExportedLabels))
	maps.Copy(l, se.Labels)
	maps.Copy(l, se.Spec.ExportedLabels)
	return l
}

// ports are the Service's ports, each with the port its endpoints listen on: the EndpointSlices'
// port of the same name (which resolves a named targetPort), else a numeric targetPort.
func ports(svc *corev1.Service, epSlices []*discoveryv1.EndpointSlice) []*apiv1.ServicePort {
	var out []*apiv1.ServicePort
	for _, p := range svc.Spec.Ports {
		port := uint32(0) // refused by mcs.Normalize, naming the port
		if p.Port > 0 {
			port = uint32(p.Port)
		}
		sp := &apiv1.ServicePort{Name: p.Name, Port: port, Protocol: string(p.Protocol)}
		if p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal > 0 && p.TargetPort.IntVal <= 65535 {
			sp.TargetPort = uint32(p.TargetPort.IntVal)
		}
		if t := slicePort(svc, p, epSlices); t != 0 {
			sp.TargetPort = t
		}
		out = append(out, sp)
	}
	return out
}

// slicePort is the port of the Service's EndpointSlices named like p (0 when none says).
func slicePort(svc *corev1.Service, p corev1.ServicePort, epSlices []*discoveryv1.EndpointSlice) uint32 {
	for _, s := range epSlices {
		if s == nil || s.Namespace != svc.Namespace || s.Labels[discoveryv1.LabelServiceName] != svc.Name {
			continue
		}
		for _, sp := range s.Ports {
			name := ""
			if sp.Name != nil {
				name = *sp.Name
			}
			proto := corev1.ProtocolTCP
			if sp.Protocol != nil {
				proto = *sp.Protocol
			}
			want := p.Protocol
			if want == "" {
				want = corev1.ProtocolTCP
			}
			if name == p.Name && proto == want && sp.Port != nil && *sp.Port > 0 && *sp.Port <= 65535 {
				return uint32(*sp.Port)
			}
		}
	}
	return 0
}

// endpoints merges the endpoints of the EndpointSlices of namespace/service, one per address.
// Slices are read in name order so that the hostname kept for an address seen twice does not
// depend on the order the caller listed them in.
func endpoints(namespace, service string, epSlices []*discoveryv1.EndpointSlice) []*apiv1.ServiceEndpoint {
	mine := make([]*discoveryv1.EndpointSlice, 0, len(epSlices))
	for _, s := range epSlices {
		if s == nil || s.Namespace != namespace || s.Labels[discoveryv1.LabelServiceName] != service {
			continue
		}
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue // FQDN slices name no backend the datapath can use
		}
		mine = append(mine, s)
	}
	slices.SortFunc(mine, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })

	var out []*apiv1.ServiceEndpoint
	byAddr := map[string]*apiv1.ServiceEndpoint{}
	for _, s := range mine {
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			addr := ep.Addresses[0]
			key := addr
			if a, err := netip.ParseAddr(addr); err == nil {
				key = a.Unmap().String() // an unparsable address is kept as is, for mcs.Normalize to refuse by name
			}
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			hostname := ""
			if ep.Hostname != nil {
				hostname = *ep.Hostname
			}
			if seen := byAddr[key]; seen != nil {
				seen.Ready = seen.Ready || ready
				if seen.Hostname == "" {
					seen.Hostname = hostname
				}
				continue
			}
			e := &apiv1.ServiceEndpoint{Ip: addr, Hostname: hostname, Ready: ready}
			byAddr[key] = e
			out = append(out, e)
		}
	}
	return out
}
