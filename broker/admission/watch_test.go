package admission

import (
	"errors"
	"strings"
	"testing"
)

func TestWatchEncodings(t *testing.T) {
	for _, tc := range []struct {
		accept []string
		want   bool
		err    string
	}{
		{accept: nil},
		{accept: []string{"zstd"}, want: true},
		{accept: []string{"br", "zstd"}, want: true},
		{accept: []string{"gzip"}},
		{accept: []string{"zstd", "a", "b", "c", "d", "e", "f", "g", "h"}, err: "accept_encodings: 9 entries, at most 8"},
		{accept: []string{"zstd", strings.Repeat("x", 33)}, err: "accept_encodings[1]: 33 bytes, at most 32"},
	} {
		got, err := WatchEncodings(tc.accept, "zstd")
		if tc.err != "" {
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field != "accept_encodings" || err.Error() != tc.err {
				t.Errorf("%q: err %v, want an InvalidError of accept_encodings: %s", tc.accept, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %v, %v; want %v", tc.accept, got, err, tc.want)
		}
	}
}
