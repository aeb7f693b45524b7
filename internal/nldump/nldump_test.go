package nldump

import (
	"errors"
	"fmt"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestRetryDumpsAgainUntilTheDumpIsConsistent(t *testing.T) {
	calls := 0
	got, err := Retry(func() ([]int, error) {
		calls++
		if calls < 3 {
			return []int{1}, fmt.Errorf("list: %w", netlink.ErrDumpInterrupted)
		}
		return []int{1, 2}, nil
	})
	if err != nil || len(got) != 2 || calls != 3 {
		t.Fatalf("Retry = %v, %v after %d calls; want the full list after 3", got, err, calls)
	}
}

func TestRetryGivesUpAndSaysSo(t *testing.T) {
	calls := 0
	_, err := Retry(func() ([]int, error) {
		calls++
		return nil, netlink.ErrDumpInterrupted
	})
	if !errors.Is(err, netlink.ErrDumpInterrupted) || calls != attempts {
		t.Fatalf("err %v after %d calls; want ErrDumpInterrupted after %d", err, calls, attempts)
	}
}

func TestRetryReturnsOtherErrorsAtOnce(t *testing.T) {
	calls := 0
	boom := errors.New("boom")
	_, err := Retry(func() (int, error) { calls++; return 0, boom })
	if !errors.Is(err, boom) || calls != 1 {
		t.Fatalf("err %v after %d calls; want boom after 1", err, calls)
	}
}
