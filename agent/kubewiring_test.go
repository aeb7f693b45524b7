package agent

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
	mcsfake "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned/fake"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/kube"
	"github.com/cablemesh/cablemesh/agent/kube/kubetest"
)

// listOnlyMCS is the mcs-api fake clientset, telling the reflector it cannot stream a list (its
// generated code predates that), as client-go's own fakes do.
type listOnlyMCS struct{ *mcsfake.Clientset }

func (listOnlyMCS) IsWatchListSemanticsUnSupported() bool { return true }

// The agent's Kubernetes source is agent/kube's Watcher over any clientset: here the fake ones,
// holding a ServiceExport with its Service and EndpointSlice; the export reaches the broker with
// this node's cluster and node.
func TestAKubernetesServiceExportReachesTheBrokerThroughTheWatcher(t *testing.T) {
	b := newBroker(t)
	ready := true
	kc := kubefake.NewSimpleClientset(
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.1.5", Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "cart"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.1.0.30"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}}},
	)
	mc := listOnlyMCS{mcsfake.NewSimpleClientset(&mcsv1a1.ServiceExport{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"}})}
	servicesAgent(t, b, &switchPinger{}, func(c *config.Config, o *Options) {
		c.Kubernetes.Enabled = true
		o.Kubernetes = kube.New(kubetest.Clientsets(kc, mc), c.Cluster, nil, kube.WithStatusUpdates(false))
	})
	eventually(t, "the ServiceExport at the broker", func() bool {
		got, _ := b.Exports("east", "east-gw1")
		return len(got) == 1 && got[0].GetName() == "cart" && got[0].GetNamespace() == "shop" && got[0].GetCluster() == "east" &&
			len(got[0].GetEndpoints()) == 1 && got[0].GetEndpoints()[0].GetIp() == "10.1.0.30" && got[0].GetPorts()[0].GetPort() == 80
	})
}
