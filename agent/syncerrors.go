package agent

import (
	"errors"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// What the broker's answer to a sync (exports, cluster policies: syncloop) means.

// refusedCode says err (one wrap around a gRPC error) carries one of codes.
func refusedCode(err error, codes ...codes.Code) bool {
	return slices.Contains(codes, status.Code(errors.Unwrap(err)))
}

// rpcMessage is what the status shows of a failed call: the broker's own words (the gRPC
// status message) when it answered, else the whole error.
func rpcMessage(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}
