package cables

import (
	"context"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/cable"
)

// driverDaemon is what driver d reports of the helper daemon it depends on
// (cable.HelperReporter), nil for a driver without one. The status has room for one daemon per
// driver, and no driver runs more than one: with several, the first that is not well is shown,
// so a problem is never hidden behind a healthy one.
func driverDaemon(ctx context.Context, d cable.Driver) *statusapi.Daemon {
	hr, ok := d.(cable.HelperReporter)
	if !ok {
		return nil
	}
	hs := hr.Helpers(ctx)
	if len(hs) == 0 {
		return nil
	}
	h := hs[0]
	for _, x := range hs {
		if x.State != cable.HelperRunning || !x.Answering {
			h = x
			break
		}
	}
	return &statusapi.Daemon{Name: h.Name, PID: h.PID, State: string(h.State), Control: h.Control, Answering: h.Answering, Error: h.Error}
}
