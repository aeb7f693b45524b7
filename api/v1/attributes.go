package apiv1

// Attributes returns what this endpoint publishes for driver in cable_attributes (nil when
// nothing). It is nil-safe like the generated getters.
func (x *Endpoint) Attributes(driver string) map[string]string {
	return x.GetCableAttributes()[driver].GetValues()
}

// SetAttributes sets what this endpoint publishes for driver; an empty attrs removes the entry.
func (x *Endpoint) SetAttributes(driver string, attrs map[string]string) {
	if len(attrs) == 0 {
		delete(x.CableAttributes, driver)
		return
	}
	if x.CableAttributes == nil {
		x.CableAttributes = map[string]*CableAttributes{}
	}
	x.CableAttributes[driver] = &CableAttributes{Values: attrs}
}
