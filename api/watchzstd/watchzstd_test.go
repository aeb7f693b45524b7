package watchzstd

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// endpoints is a watch message of n endpoint UPSERTs, as the broker encodes them.
func endpoints(t testing.TB, n int) []byte {
	t.Helper()
	resp := &apiv1.WatchResponse{Revision: 900, More: true}
	for i := range n {
		key := make([]byte, 32)
		_, _ = rand.Read(key)
		c := i / 20
		ep := &apiv1.Endpoint{Cluster: fmt.Sprintf("c%03d", c), Node: fmt.Sprintf("gw%02d", i%20), PrivateIp: fmt.Sprintf("100.64.%d.%d", i/250, i%250+1),
			Subnets: []string{fmt.Sprintf("10.%d.0.0/17", c), fmt.Sprintf("10.%d.128.0/17", c)}, Drivers: []string{"wireguard"},
			CablePorts: map[string]uint32{"wireguard": 51820}, HealthCheckIp: fmt.Sprintf("10.%d.0.1", c), Revision: uint64(100 + i)}
		ep.SetAttributes("wireguard", map[string]string{"publicKey": base64.StdEncoding.EncodeToString(key)})
		resp.Events = append(resp.Events, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: "endpoint", Key: ep.Cluster + "/" + ep.Node, Revision: ep.Revision,
			Resource: &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: ep}}})
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A message compressed and expanded is the message, and a fleet's endpoints compress at least
// three to one.
func TestEncodeExpandIsTheMessage(t *testing.T) {
	for _, n := range []int{3, 140, 5100} {
		raw := endpoints(t, n)
		msg := Encode(raw)
		var got apiv1.WatchResponse
		if err := proto.Unmarshal(msg, &got); err != nil {
			t.Fatal(err)
		}
		if len(got.Encoded) == 0 || len(got.Events) != 0 || got.Revision != 0 {
			t.Fatalf("%d endpoints: the message sent holds %d events, revision %d, %d encoded bytes; want only the encoded field", n, len(got.Events), got.Revision, len(got.Encoded))
		}
		if err := Expand(&got); err != nil {
			t.Fatal(err)
		}
		var want apiv1.WatchResponse
		if err := proto.Unmarshal(raw, &want); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&got, &want) {
			t.Fatalf("%d endpoints: expanded, the message differs from the one compressed", n)
		}
		if n >= 140 && len(msg)*3 > len(raw) {
			t.Errorf("%d endpoints: %d bytes compressed to %d, want at most a third", n, len(raw), len(msg))
		}
	}
}

// What compressing would not make smaller, or is too small to bother with, goes as it is.
func TestEncodeLeavesWhatDoesNotGain(t *testing.T) {
	small := endpoints(t, 2)
	if len(small) >= minEncodeBytes {
		t.Fatalf("two endpoints are %d bytes, not a small message", len(small))
	}
	if got := Encode(small); !bytes.Equal(got, small) {
		t.Errorf("a %d-byte message was changed", len(small))
	}
	noise := make([]byte, 4096)
	_, _ = rand.Read(noise)
	raw := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), noise)
	if got := Encode(raw); !bytes.Equal(got, raw) {
		t.Errorf("random bytes were compressed from %d to %d bytes", len(raw), len(got))
	}
}

// The events of a message and of its encoded content are all applied, its own first.
func TestExpandMergesAfterTheMessagesOwnFields(t *testing.T) {
	inner, _ := proto.Marshal(&apiv1.WatchResponse{Events: []*apiv1.Event{{Key: "b"}}, Revision: 7})
	resp := &apiv1.WatchResponse{Events: []*apiv1.Event{{Key: "a"}}, Encoded: compress(inner)}
	if err := Expand(resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.Events) != 2 || resp.Events[0].Key != "a" || resp.Events[1].Key != "b" || resp.Revision != 7 || resp.Encoded != nil {
		t.Fatalf("expanded: %v", resp)
	}
}

func compress(b []byte) []byte { return encoder().EncodeAll(b, nil) }

// Bad frames are refused with an error that says what, never expanded without bound.
func TestExpandRefusesBadFrames(t *testing.T) {
	nested, _ := proto.Marshal(&apiv1.WatchResponse{Encoded: compress([]byte("x"))})
	bomb := bytes.Repeat([]byte{0}, MaxContentBytes+1)
	big, _ := zstd.NewWriter(nil)
	for name, frame := range map[string][]byte{
		"not zstd":             []byte("plain text, not a frame"),
		"truncated":            compress(endpoints(t, 50))[:100],
		"past the bound":       big.EncodeAll(bomb, nil),
		"another encoded":      compress(nested),
		"content not protobuf": compress([]byte{0xff, 0xff, 0xff}),
	} {
		err := Expand(&apiv1.WatchResponse{Encoded: frame})
		if err == nil || !strings.Contains(err.Error(), "encoded") {
			t.Errorf("%s: %v, want an error about the encoded field", name, err)
		}
	}
}

func FuzzExpand(f *testing.F) {
	f.Add(compress(endpoints(f, 10)))
	f.Add([]byte("garbage"))
	f.Add(compress([]byte{0x3a, 0x01, 0x00}))
	f.Fuzz(func(t *testing.T, frame []byte) {
		resp := &apiv1.WatchResponse{Encoded: frame}
		if err := Expand(resp); err == nil && len(resp.Encoded) != 0 {
			t.Fatalf("expanded without error but still encoded")
		}
	})
}

func BenchmarkDecodeSnapshot(b *testing.B) {
	frame := compress(endpoints(b, 5100))
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if _, err := Decode(frame); err != nil {
			b.Fatal(err)
		}
	}
}
