package cable

import "log/slog"

// Logger is the logger a driver logs through: n.Log (slog.Default() only when it is nil), with
// the driver's name under the key "driver".
func (n LocalNode) Logger(driver string) *slog.Logger {
	log := n.Log
	if log == nil {
		log = slog.Default()
	}
	return log.With("driver", driver)
}
