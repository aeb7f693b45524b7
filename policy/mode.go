package policy

import "maps"

// Pair mode: a generic option of a pair, carried in spec.cableDriver.options next to the driver's
// own options because that is where a policy says how a pair is connected. It is the policy
// package's, not the driver's: cable drivers validate only their own options, so every caller
// hands a driver DriverOptions(opts), never the raw map.
const (
	// ModeOption is the option key ("spec.cableDriver.options.mode").
	ModeOption = "mode"
	// ModeGateway puts the pair in gateway mode: its cable carries only the two gateways' mesh
	// addresses, and services are reached through the remote gateway's ingress.
	ModeGateway = "gateway"
	// ModeDirect is the default: the cable carries the clusters' pod and service CIDRs.
	ModeDirect = "direct"
)

// GatewayModeOption reports whether opts put the pair in gateway mode (opts["mode"] is
// "gateway"). A pair is also in gateway mode when either cluster joined in gateway mode; that is
// the caller's to combine.
func GatewayModeOption(opts map[string]string) bool {
	return opts[ModeOption] == ModeGateway
}

// DriverOptions is opts without the pair options the policy package owns (mode): what the cable
// driver validates and receives. It is a copy (the caller may keep opts); nil for nil.
func DriverOptions(opts map[string]string) map[string]string {
	if opts == nil {
		return nil
	}
	out := maps.Clone(opts)
	delete(out, ModeOption)
	return out
}

// validateMode checks the mode option of spec.cableDriver.options, when given.
func validateMode(field string, opts map[string]string) error {
	v, ok := opts[ModeOption]
	if !ok {
		return nil
	}
	switch v {
	case ModeGateway, ModeDirect:
		return nil
	}
	return fieldErr(field+"."+ModeOption, "%q is not %s or %s", v, ModeGateway, ModeDirect)
}
