package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/registry"
	"github.com/cablemesh/cablemesh/broker/store"
)

func TestEveryRefusalHasOneCodeAndKeepsItsMessage(t *testing.T) {
	msg := errors.New("the message")
	tests := []struct {
		name    string
		err     error
		code    codes.Code
		message string
	}{
		{"an invalid field is InvalidArgument", &admission.InvalidError{Field: "f", Err: msg}, codes.InvalidArgument, "the message"},
		{"a conflict is AlreadyExists", &admission.ConflictError{Err: msg}, codes.AlreadyExists, "the message"},
		{"a missing resource is NotFound", &admission.NotFoundError{Err: msg}, codes.NotFound, "the message"},
		{"another's resource is PermissionDenied", &admission.ForbiddenError{Err: msg}, codes.PermissionDenied, "the message"},
		{"a refused credential is Unauthenticated", &admission.CredentialError{Err: msg}, codes.Unauthenticated, "the message"},
		{"a protected resource is FailedPrecondition", &admission.ProtectedError{Err: msg}, codes.FailedPrecondition, "the message"},
		{"an overlap is FailedPrecondition", &registry.OverlapError{Cluster: "a", Kind: "pod CIDR", OtherCluster: "b", OtherKind: "pod CIDR"}, codes.FailedPrecondition,
			`pod CIDR invalid Prefix of cluster "a" overlaps pod CIDR invalid Prefix of cluster "b"; overlapping CIDRs are admitted only between two gateway-mode clusters, and "a" and "b" are not (join both with ` + "`cablectl cluster join-token --gateway-mode`" + `, or choose disjoint CIDRs)`},
		{"a full mesh is ResourceExhausted, with the context around it", fmt.Errorf("cannot add cluster %q: %w", "x", admission.ErrMeshFull), codes.ResourceExhausted,
			`cannot add cluster "x": mesh is full`},
		{"a full VIP range is ResourceExhausted", &admission.ExhaustedError{Resource: "service VIP", Err: msg}, codes.ResourceExhausted, "the message"},
		{"a slow watcher is ResourceExhausted", store.ErrWatcherTooSlow, codes.ResourceExhausted, store.ErrWatcherTooSlow.Error()},
		{"a broker that cannot serve now is Unavailable", unavailableError{errStopping}, codes.Unavailable, errStopping.Error()},
		{"a cancelled call is Canceled", context.Canceled, codes.Canceled, "context canceled"},
		{"anything else is the broker's own Internal failure in op", errors.New("disk on fire"), codes.Internal, "op: disk on fire"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, ok := status.FromError(rpcError("op", tt.err))
			if !ok || st.Code() != tt.code || st.Message() != tt.message {
				t.Fatalf("got %v %q, want %v %q", st.Code(), st.Message(), tt.code, tt.message)
			}
		})
	}
	if rpcError("op", nil) != nil {
		t.Fatal("no error became one")
	}
}
