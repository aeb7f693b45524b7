package brokerclient

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func busyErr(t *testing.T, code codes.Code, hint time.Duration) error {
	t.Helper()
	st, err := status.New(code, "busy").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(hint)})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// Only ResourceExhausted with a RetryInfo is a busy broker: a full mesh address range (the same
// code, no hint) or any other failure is not, and keeps its own handling.
func TestBusyHintIsReadOnlyFromABusyAnswer(t *testing.T) {
	for _, tt := range []struct {
		name     string
		err      error
		want     time.Duration
		wantBusy bool
	}{
		{"a busy answer", busyErr(t, codes.ResourceExhausted, 2*time.Second), 2 * time.Second, true},
		{"resource exhausted without a hint", status.Error(codes.ResourceExhausted, "mesh address range full"), 0, false},
		{"a hint on another code", busyErr(t, codes.Unavailable, time.Second), 0, false},
		{"a zero hint", busyErr(t, codes.ResourceExhausted, 0), 0, false},
		{"a negative hint", busyErr(t, codes.ResourceExhausted, -time.Second), 0, false},
		{"not a status", errors.New("dial: refused"), 0, false},
		{"no error", nil, 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, busy := busyHint(tt.err)
			if got != tt.want || busy != tt.wantBusy {
				t.Errorf("busyHint = %s, %v; want %s, %v", got, busy, tt.want, tt.wantBusy)
			}
		})
	}
}

func TestBusyWaitIsJitteredAndCapped(t *testing.T) {
	lowest := func(int64) int64 { return 0 }
	highest := func(k int64) int64 { return k - 1 }
	for _, tt := range []struct {
		name string
		hint time.Duration
		n    func(int64) int64
		want time.Duration
	}{
		{"the least jitter waits the hint", 2 * time.Second, lowest, 2 * time.Second},
		{"the most waits a quarter longer", 2 * time.Second, highest, 2500 * time.Millisecond},
		{"a long hint is capped", time.Hour, lowest, MaxBusyWait},
		{"and so is the wait after the jitter", 9 * time.Second, highest, MaxBusyWait},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := busyWait(tt.hint, tt.n); got != tt.want {
				t.Errorf("busyWait(%s) = %s, want %s", tt.hint, got, tt.want)
			}
		})
	}
	for range 1000 {
		d, busy := BusyWait(busyErr(t, codes.ResourceExhausted, time.Second))
		if !busy || d < time.Second || d > 5*time.Second/4 {
			t.Fatalf("BusyWait(1s hint) = %s, %v; want within [1s, 1.25s]", d, busy)
		}
	}
}

func TestAcceptBusyMarksTheCall(t *testing.T) {
	md, _ := metadata.FromOutgoingContext(AcceptBusy(context.Background()))
	if got := md.Get(AcceptBusyKey); len(got) != 1 || got[0] != "1" {
		t.Fatalf("outgoing metadata %v, want %s: 1", md, AcceptBusyKey)
	}
}
