// Package nldump retries netlink dumps that the kernel interrupted.
//
// A netlink dump (list links, addresses, routes, rules, neighbours) that runs while something
// else changes the same table is marked NLM_F_DUMP_INTR, and vishvananda/netlink then returns
// what it read with ErrDumpInterrupted: a partial list. A caller that acts on a partial list
// deletes or misses objects; one that fails on the error fails for a change that had nothing to
// do with it (a driver's Init failing because another driver created its link at the same
// moment). A fresh dump is consistent again, so the answer is to dump again.
package nldump

import (
	"errors"

	"github.com/vishvananda/netlink"
)

// attempts bounds the retries: each interrupted dump means a change raced it, and a node does
// not change its tables without pause.
const attempts = 8

// Retry runs dump until it is not interrupted, at most a few times; after that it returns the
// last error (ErrDumpInterrupted, with the partial result), so a caller never loops forever.
func Retry[T any](dump func() (T, error)) (T, error) {
	var (
		out T
		err error
	)
	for range attempts {
		out, err = dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	return out, err
}
