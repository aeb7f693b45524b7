package broker

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/store"
)

// unavailableError says the broker cannot serve a call now, and the caller should come back
// (agents reconnect their watch with since_revision).
type unavailableError struct{ error }

func (e unavailableError) Unwrap() error { return e.error }

// rpcError is the one place that turns what handlers and their decisions return into the gRPC
// status the API promises: admission's typed refusals carry the meaning, and their messages are
// the messages callers read. Anything else is the broker's own failure in op: Internal.
func rpcError(op string, err error) error {
	if err == nil {
		return nil
	}
	var (
		invalid     *admission.InvalidError
		conflict    *admission.ConflictError
		notFound    *admission.NotFoundError
		forbidden   *admission.ForbiddenError
		credential  *admission.CredentialError
		protected   *admission.ProtectedError
		overlap     *admission.OverlapError
		exhausted   *admission.ExhaustedError
		unavailable unavailableError
	)
	code := codes.Internal
	switch {
	case errors.As(err, &invalid):
		code = codes.InvalidArgument
	case errors.As(err, &conflict):
		code = codes.AlreadyExists
	case errors.As(err, &notFound):
		code = codes.NotFound
	case errors.As(err, &forbidden):
		code = codes.PermissionDenied
	case errors.As(err, &credential):
		code = codes.Unauthenticated
	case errors.As(err, &protected), errors.As(err, &overlap):
		code = codes.FailedPrecondition
	case errors.Is(err, admission.ErrMeshFull), errors.Is(err, store.ErrWatcherTooSlow), errors.As(err, &exhausted):
		code = codes.ResourceExhausted
	case errors.As(err, &unavailable):
		code = codes.Unavailable
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	default:
		return status.Errorf(codes.Internal, "%s: %v", op, err)
	}
	return status.Error(code, err.Error())
}
