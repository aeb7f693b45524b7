package deploy

import (
	"os"
	"regexp"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	ipsecspec "github.com/cablemesh/cablemesh/cable/ipsec/spec"
)

// TestGatewaysRunTheIPsecDriver: the gateways' config names the ipsec driver, the image carries
// charon where that config looks for it, and the pod grants what charon needs: the capabilities
// (xfrm and routes, IKE's port 500, the private /run it is started under), /dev/net/tun
// (kernel-libipsec's ipsec0) and a writable state dir for its socket, pid file and log.
func TestGatewaysRunTheIPsecDriver(t *testing.T) {
	for name, m := range map[string]manifests{"deploy/daemonset": memberCluster(t), "install output": installed(t, installValues)} {
		t.Run(name, func(t *testing.T) {
			cfg := agentConfig(t, m.configMaps[0])
			if !slices.Contains(cfg.CableDrivers, ipsecspec.Name) {
				t.Fatalf("the gateways' cableDrivers %q lack %s", cfg.CableDrivers, ipsecspec.Name)
			}
			charon := ipsecspec.DefaultCharon
			if v, ok := cfg.Drivers[ipsecspec.Name][ipsecspec.KeyCharon]; ok {
				charon = v
			}
			if charon != ipsecspec.DefaultCharon {
				t.Errorf("ipsec.charon %q: the image carries charon at %s", charon, ipsecspec.DefaultCharon)
			}
			ds := m.daemonSets[0]
			ps := ds.Spec.Template.Spec
			agent := container(t, ps.Containers, AgentContainer)
			for _, c := range []corev1.Capability{"NET_ADMIN", "NET_BIND_SERVICE", "SYS_ADMIN"} {
				if !slices.Contains(agent.SecurityContext.Capabilities.Add, c) {
					t.Errorf("DaemonSet %s does not add %s, which charon needs", ds.Name, c)
				}
			}
			if v := mountFor(t, ps, agent, "/dev/net/tun"); v.HostPath == nil || v.HostPath.Path != "/dev/net/tun" {
				t.Errorf("/dev/net/tun (kernel-libipsec's ipsec0) is not the host's device: %+v", v)
			}
			if v := mountFor(t, ps, agent, cfg.StateDir+"/ipsec/charon.vici"); v.HostPath == nil {
				t.Errorf("charon's files under %s/ipsec are not on a host path (the root file system is read-only): %+v", cfg.StateDir, v)
			}
		})
	}
}

// TestImageCarriesCharonAtTheDriversPath: scripts/image.sh copies charon and the plugins the
// driver's strongswan.conf loads into the agent's image, at the driver's default path.
func TestImageCarriesCharonAtTheDriversPath(t *testing.T) {
	script, err := os.ReadFile("../scripts/image.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := regexp.MustCompile(`(?m)^IPSEC_DIR=(\S+)$`).FindSubmatch(script)
	if dir == nil || string(dir[1])+"/charon" != ipsecspec.DefaultCharon {
		t.Errorf("scripts/image.sh puts charon under IPSEC_DIR=%q, the driver's default is %s", dir, ipsecspec.DefaultCharon)
	}
	plugins := regexp.MustCompile(`(?m)^CHARON_PLUGINS=\(([^)]*)\)$`).FindSubmatch(script)
	if plugins == nil {
		t.Fatal("scripts/image.sh has no CHARON_PLUGINS=(...) line")
	}
	have := regexp.MustCompile(`\S+`).FindAllString(string(plugins[1]), -1)
	// Every plugin the driver may load: both datapaths, as the image serves nodes with and
	// without ESP in the kernel.
	for _, p := range []string{"random", "nonce", "openssl", "kdf", "kernel-libipsec", "kernel-netlink", "socket-default", "vici"} {
		if !slices.Contains(have, p) {
			t.Errorf("the image lacks charon's plugin %s (CHARON_PLUGINS %q)", p, have)
		}
	}
}
