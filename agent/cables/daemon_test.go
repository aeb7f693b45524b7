package cables

import (
	"context"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
)

// helperDriver is a cable driver that reports helper daemons; only Helpers is called.
type helperDriver struct {
	cable.Driver
	helpers []cable.HelperStatus
}

func (d helperDriver) Helpers(context.Context) []cable.HelperStatus { return d.helpers }

func TestDriverDaemon(t *testing.T) {
	ctx := context.Background()
	ok := cable.HelperStatus{Name: "charon", PID: 7, State: cable.HelperRunning, Control: "/x/charon.vici", Answering: true}
	stopped := cable.HelperStatus{Name: "charon", PID: 4242, State: cable.HelperStopped, Control: "/y/charon.vici",
		Error: "no answer to version within 1s: i/o timeout"}

	if d := driverDaemon(ctx, helperDriver{}.Driver); d != nil {
		t.Errorf("a driver without helpers reports daemon %+v, want none", d)
	}
	if d := driverDaemon(ctx, helperDriver{}); d != nil {
		t.Errorf("a driver reporting no helper gives daemon %+v, want none", d)
	}
	d := driverDaemon(ctx, helperDriver{helpers: []cable.HelperStatus{stopped}})
	if d == nil || d.Name != "charon" || d.PID != 4242 || d.State != "stopped" || d.Answering || d.Control != "/y/charon.vici" || d.Error != stopped.Error {
		t.Errorf("daemon %+v, want the stopped charon as reported", d)
	}
	// With several, a sick one is not hidden behind a healthy one.
	if d := driverDaemon(ctx, helperDriver{helpers: []cable.HelperStatus{ok, stopped}}); d == nil || d.PID != 4242 {
		t.Errorf("daemon %+v, want the stopped one (pid 4242)", d)
	}
	if d := driverDaemon(ctx, helperDriver{helpers: []cable.HelperStatus{ok}}); d == nil || !d.Answering || d.State != "running" {
		t.Errorf("daemon %+v, want the running one", d)
	}
}
