package cable

// Constructor adapts a driver package's NewDriver, which returns its concrete type (for its
// tests and tools), to the Factory the registry takes, so that no driver needs a New of its own
// that only converts.
func Constructor[D Driver](build func(LocalNode, Settings) (D, error)) Factory {
	return func(node LocalNode, settings Settings) (Driver, error) {
		d, err := build(node, settings)
		if err != nil {
			// Not d: a nil *T in a Driver interface is not a nil Driver.
			return nil, err
		}
		return d, nil
	}
}

// Check adapts a parser that returns the validated form (a driver's parseSettings or
// parseOptions) to the error-only check Registration.ParseSettings and ValidateOptions take.
func Check[In, Out any](parse func(In) (Out, error)) func(In) error {
	return func(in In) error {
		_, err := parse(in)
		return err
	}
}
