package config

import (
	"strings"
	"testing"
)

func TestIngressDefaultsAndValidation(t *testing.T) {
	base := "cluster: east\nnode: gw1\nbroker: 127.0.0.1:7000\n"
	c, err := Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if in := c.Ingress; in.Mode != IngressKernel || in.PortRange != DefaultIngressPortRange || in.SNIPort != DefaultIngressSNIPort ||
		in.HTTPPort != DefaultIngressHTTPPort || in.MeshDomain != DefaultMeshDomain || in.XDS.Listen != "" {
		t.Errorf("defaults: %+v", in)
	}
	for _, tc := range []struct {
		name, block, want string
	}{
		{"an unknown mode is refused", "ingress: {mode: nginx}", `ingress.mode: "nginx" is not one of kernel, envoy`},
		{"a port range that is no range", "ingress: {portRange: 15000}", `ingress.portRange: "15000" is not FIRST-LAST`},
		{"a reversed port range", "ingress: {portRange: 16000-15000}", `ingress.portRange: "16000-15000" is out of range`},
		{"a range over privileged ports", "ingress: {portRange: 80-1000}", `ingress.portRange: "80-1000" is out of range`},
		{"an SNI port inside the range", "ingress: {sniPort: 15443}", `ingress.sniPort: 15443 lies inside ingress.portRange`},
		{"an HTTP port that is no port", "ingress: {httpPort: 70000}", `ingress.httpPort: 70000 is not a port`},
		{"the same SNI and HTTP port", "ingress: {sniPort: 17000, httpPort: 17000}", `ingress.httpPort: 17000 is also ingress.sniPort`},
		{"a mesh domain with capitals", "ingress: {meshDomain: Mesh.Local}", `ingress.meshDomain: "Mesh.Local"`},
		{"an xDS address on every interface", `ingress: {xds: {listen: "0.0.0.0:18000"}}`, `ingress.xds.listen: "0.0.0.0:18000" is a TCP address`},
		{"an xDS address on another host", `ingress: {xds: {listen: "10.0.0.1:18000"}}`, `ingress.xds.listen: "10.0.0.1:18000" is a TCP address`},
		{"an xDS address on loopback TCP", `ingress: {xds: {listen: "127.0.0.1:18000"}}`, `ingress.xds.listen: "127.0.0.1:18000" is a TCP address: the xDS server listens only on a unix socket`},
		{"an xDS address on IPv6 loopback", `ingress: {xds: {listen: "[::1]:18000"}}`, `ingress.xds.listen: "[::1]:18000" is a TCP address`},
		{"an xDS address on localhost", `ingress: {xds: {listen: "localhost:18000"}}`, `ingress.xds.listen: "localhost:18000" is a TCP address`},
		{"an xDS path that is no path", `ingress: {xds: {listen: "xds.sock"}}`, `ingress.xds.listen: "xds.sock" is not a unix socket path`},
		{"a negative allowUID", `ingress: {xds: {listen: /run/x.sock, allowUID: -1}}`, `ingress.xds.allowUID: -1 is not a uid/gid`},
		{"allowUID (uid_t)-1", `ingress: {xds: {listen: /run/x.sock, allowUID: 4294967295}}`, `ingress.xds.allowUID: 4294967295 is not a uid/gid`},
		{"allowGID without a server", `ingress: {xds: {allowGID: 101}}`, `ingress.xds.allowGID: 101 is set, but ingress.xds.listen is not`},
		{"a relative xDS socket", `ingress: {xds: {listen: "unix:run/xds.sock"}}`, `ingress.xds.listen: "unix:run/xds.sock": a unix socket path must be absolute`},
		{"an xDS host name", `ingress: {xds: {listen: "envoy.example:18000"}}`, `ingress.xds.listen: "envoy.example:18000" is a TCP address`},
		{"an unknown ingress field", "ingress: {xds: {port: 1}}", `unknown field "port"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(base + tc.block + "\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	for _, ok := range []string{"/run/cablemesh/xds.sock", "unix:/run/x.sock", "/run/x.sock, allowUID: 101, allowGID: 101"} {
		if _, err := Parse([]byte(base + "ingress: {mode: envoy, xds: {listen: " + ok + "}}\n")); err != nil {
			t.Errorf("listen %q refused: %v", ok, err)
		}
	}
}

func FuzzParseXDSListen(f *testing.F) {
	for _, s := range []string{"/run/x.sock", "unix:/x", "127.0.0.1:1", "[::1]:2", "localhost:3", "0.0.0.0:1", "unix:", ":80", "localhost:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		network, addr, err := ParseXDSListen(s)
		if err != nil {
			if network != "" || addr != "" {
				t.Fatalf("error with a network: %q %v", network, err)
			}
			return
		}
		switch network {
		case "unix":
			if !strings.HasPrefix(addr, "/") || len(addr) > 107 {
				t.Fatalf("%q -> unix %q", s, addr)
			}
		default:
			t.Fatalf("%q -> network %q", s, network)
		}
	})
}

func FuzzParsePortRange(f *testing.F) {
	for _, s := range []string{"15000-15999", "1-2", "65535-65535", "a-b", "-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		first, last, err := ParsePortRange(s)
		if err == nil && (first < 1024 || last < first) {
			t.Fatalf("%q -> %d..%d", s, first, last)
		}
	})
}
