package cables

import (
	"os"
	"testing"

	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
)

// TestMain registers fake cable drivers: the planner asks the registry what a remote endpoint
// must publish for a driver, and these tests run without the real drivers.
func TestMain(m *testing.M) {
	fakedriver.RegisterFakes("wireguard", "vxlan", "ipsec")
	os.Exit(m.Run())
}
