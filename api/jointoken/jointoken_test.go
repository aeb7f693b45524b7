package jointoken

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var key = []byte("0123456789abcdef0123456789abcdef")

func claims(exp time.Time) Claims {
	return Claims{Cluster: "east", ClusterUID: "u1", Expires: exp, CAHash: CAHash([]byte("ca")), Nonce: "n"}
}

func TestVerify(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	good, err := Sign(claims(now.Add(time.Hour)), key)
	if err != nil {
		t.Fatal(err)
	}
	expired, _ := Sign(claims(now.Add(-time.Second)), key)
	otherKey, _ := Sign(claims(now.Add(time.Hour)), []byte("ffffffffffffffffffffffffffffffff"))
	parts := strings.Split(good, ".")
	tampered := parts[0] + "." + parts[1] + "x." + parts[2]
	for _, tc := range []struct {
		name, token string
		want        error
	}{
		{"a fresh token signed by the broker verifies", good, nil},
		{"an expired token is refused", expired, ErrExpired},
		{"a token signed by another key is refused as forged", otherKey, ErrSignature},
		{"a token with an edited payload is refused as forged", tampered, ErrSignature},
		{"garbage is refused as malformed", "hello", ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Verify(tc.token, key, now)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify error = %v, want %v", err, tc.want)
			}
			if tc.want == nil && c.Cluster != "east" {
				t.Fatalf("cluster = %q, want east", c.Cluster)
			}
		})
	}
}

func TestDecodeReadsCAHashWithoutKey(t *testing.T) {
	c := claims(time.Now().Add(time.Hour))
	tok, _ := Sign(c, key)
	got, err := Decode(tok)
	if err != nil || got.CAHash != c.CAHash {
		t.Fatalf("Decode = %+v, %v; want CAHash %s", got, err, c.CAHash)
	}
}

func FuzzDecode(f *testing.F) {
	tok, _ := Sign(claims(time.Now().Add(time.Hour)), key)
	f.Add(tok)
	f.Add("cmj1..")
	f.Add("cmj1.e30.AA")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Decode(s)
		if err == nil && (c.Cluster == "" || c.ClusterUID == "") {
			t.Fatalf("Decode accepted claims without cluster/uid: %+v", c)
		}
		_, _ = Verify(s, key, time.Now())
	})
}
