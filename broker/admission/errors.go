package admission

import (
	"fmt"

	"github.com/cablemesh/cablemesh/broker/registry"
)

// The refusals admission decides. Each says what was refused in its fields, for callers that
// branch on them, and in its message, which is what the API caller reads: it names the object,
// the field and the value. The broker maps each type to one gRPC code in one place.

// InvalidError refuses a request with a missing or malformed field: the request can never
// succeed as it is.
type InvalidError struct {
	Field string // the request field as the API spells it: "cluster", "pod_cidrs", "lease_seconds", ...
	Value string // the value refused; empty when the field is missing
	Err   error  // why; its message is the whole message
}

func (e *InvalidError) Error() string { return e.Err.Error() }
func (e *InvalidError) Unwrap() error { return e.Err }

func invalid(field, value string, err error) error {
	return &InvalidError{Field: field, Value: value, Err: err}
}

func invalidf(field, value, format string, args ...any) error {
	return invalid(field, value, fmt.Errorf(format, args...))
}

// ConflictError refuses to create what exists already, differently: cluster names are unique in
// the mesh, so a join-token request that disagrees with the stored cluster is most likely a
// second cluster under a name already taken.
type ConflictError struct {
	Kind  string // "cluster"
	Name  string
	Field string // what differs: "pod_cidrs", "service_cidrs", "labels"
	Err   error
}

func (e *ConflictError) Error() string { return e.Err.Error() }
func (e *ConflictError) Unwrap() error { return e.Err }

// NotFoundError refuses a request about resources that do not exist.
type NotFoundError struct {
	Kind  string   // "cluster", "endpoint", "policy"
	Names []string // the missing ones
	Err   error
}

func (e *NotFoundError) Error() string { return e.Err.Error() }
func (e *NotFoundError) Unwrap() error { return e.Err }

// ForbiddenError refuses a caller who asks for something that is not its own: another cluster's
// join, another node's endpoint.
type ForbiddenError struct {
	Caller string // who asked, e.g. "agent east/gw1"
	Target string // what it asked for, e.g. "west/gw1"
	Err    error
}

func (e *ForbiddenError) Error() string { return e.Err.Error() }
func (e *ForbiddenError) Unwrap() error { return e.Err }

// CredentialError refuses a credential: a join token that does not verify, expired or names
// another mesh, or a certificate of a cluster that was removed since it was issued. The caller
// needs a new credential, not a new request.
type CredentialError struct {
	Cluster string // the cluster the credential names, when it names one
	Err     error
}

func (e *CredentialError) Error() string { return e.Err.Error() }
func (e *CredentialError) Unwrap() error { return e.Err }

// ProtectedError refuses to remove something the mesh cannot do without (the mesh default
// policy); changing it is allowed.
type ProtectedError struct {
	Kind, Name string
	Err        error
}

func (e *ProtectedError) Error() string { return e.Err.Error() }
func (e *ProtectedError) Unwrap() error { return e.Err }

// ExhaustedError refuses a request that needs something of which none is left: a service VIP
// when the configured range is full.
type ExhaustedError struct {
	Resource string // "service VIP"
	Err      error
}

func (e *ExhaustedError) Error() string { return e.Err.Error() }
func (e *ExhaustedError) Unwrap() error { return e.Err }

// OverlapError refuses a cluster whose CIDRs overlap another cluster's (or each other): the
// rule is registry's, which is where the type lives.
type OverlapError = registry.OverlapError

// ErrMeshFull refuses a new cluster when every cluster ID is in use (wrapped, with the
// cluster's name).
var ErrMeshFull = registry.ErrMeshFull
