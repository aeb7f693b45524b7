package brokerclient

import (
	"errors"
	"log/slog"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RefusedCode says whether err (wrapped once by the caller's context) is a gRPC status with one
// of codes.
func RefusedCode(err error, codes ...codes.Code) bool {
	return slices.Contains(codes, status.Code(errors.Unwrap(err)))
}

// RPCMessage is the broker's own words of a gRPC error, else the error's text.
func RPCMessage(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}

// RepeatFilter tells a failure that repeats the previous one, so that a broker that stays down is
// logged once at warn level and then at debug level, not every few seconds.
type RepeatFilter struct{ last string }

// Repeated reports whether err has the text of the previous call's, and remembers it.
func (f *RepeatFilter) Repeated(err error) bool {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	r := msg == f.last
	f.last = msg
	return r
}

// Reset forgets the previous failure (after a success).
func (f *RepeatFilter) Reset() { f.last = "" }

// WarnLevel is the level of a failure's log line: debug when it repeats the previous one.
func WarnLevel(repeated bool) slog.Level {
	if repeated {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}

// UnimplementedRetry is how long the agent waits before asking a broker that does not know a call
// (an older broker: renewals, ingress certificates) again, once it may have been upgraded.
const UnimplementedRetry = time.Hour
