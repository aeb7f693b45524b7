package cable

import "fmt"

// CheckRemote is what every driver's Connect checks first: remote names its cluster and has a
// usable underlay address. The errors name the driver, the cluster and the field.
func CheckRemote(driver string, remote RemoteEndpoint) error {
	if remote.Cluster == "" {
		return fmt.Errorf("%s connect: remote cluster name is empty", driver)
	}
	if !remote.Address.IsValid() || remote.Address.IsUnspecified() {
		return fmt.Errorf("%s connect to cluster %s: address %q is not a usable IP", driver, remote.Cluster, remote.Address)
	}
	return nil
}

// NotInitialised is the error of a driver call made before a successful Init (or after Cleanup
// or Close): what failed, wrapping ErrNotInitialised.
func NotInitialised(what string) error {
	return fmt.Errorf("%s: %w", what, ErrNotInitialised)
}
