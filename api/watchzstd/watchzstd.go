// Package watchzstd is the zstd encoding of watch messages (WatchResponse.encoded): the broker
// compresses the large messages it shares between agents once, and agents that accept it
// (WatchRequest.accept_encodings) expand them. Each endpoint goes to every agent, so a fleet of
// N gateways starting at once is N x N endpoint records on the wire: 5.7 GB at 5,100 gateways,
// a quarter of that compressed, which both ends otherwise spend their CPU encrypting, copying
// and decrypting.
package watchzstd

import (
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Name is the encoding's name in WatchRequest.accept_encodings.
const Name = "zstd"

// MaxContentBytes bounds what one encoded field may expand to: the 4 MiB an agent's gRPC client
// receives in one message by default. The broker compresses messages that fit in that
// uncompressed, so a larger content is a bomb, refused before it is decoded.
const MaxContentBytes = 4 << 20

// minEncodeBytes: smaller messages go as they are (a zstd frame costs a dozen bytes and a
// message this small has little to compress).
const minEncodeBytes = 512

// encodedField is WatchResponse.encoded's field number.
const encodedField = 7

// The encoder is the fastest level: a message is compressed once for every agent that is sent
// it, but while the store publishes, and its ratio on watch messages (4.2 on endpoints) is the
// default level's. No checksum: TLS protects the stream already.
var encoder = sync.OnceValue(func() *zstd.Encoder {
	e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderCRC(false))
	if err != nil {
		panic(fmt.Sprintf("watchzstd: zstd encoder: %v", err)) // only for invalid options
	}
	return e
})

var decoder = sync.OnceValue(func() *zstd.Decoder {
	d, err := zstd.NewReader(nil, zstd.WithDecoderMaxMemory(MaxContentBytes))
	if err != nil {
		panic(fmt.Sprintf("watchzstd: zstd decoder: %v", err)) // only for invalid options
	}
	return d
})

// Encode returns msg, a WatchResponse as encoded for the wire, as the message an agent that
// accepts zstd is sent instead: only the encoded field, holding msg compressed. It returns msg
// itself when compressing would not make it smaller, or msg is too small to bother or too large
// for an agent to expand.
func Encode(msg []byte) []byte {
	if len(msg) < minEncodeBytes || len(msg) > MaxContentBytes {
		return msg
	}
	frame := encoder().EncodeAll(msg, make([]byte, 0, len(msg)/2))
	n := protowire.SizeTag(encodedField) + protowire.SizeBytes(len(frame))
	if n >= len(msg) {
		return msg
	}
	out := protowire.AppendTag(make([]byte, 0, n), encodedField, protowire.BytesType)
	return protowire.AppendBytes(out, frame)
}

// Decode returns the content of an encoded field: a WatchResponse, encoded. It refuses a frame
// that is not zstd, is corrupt, or would expand past MaxContentBytes.
func Decode(frame []byte) ([]byte, error) {
	out, err := decoder().DecodeAll(frame, nil)
	if err != nil {
		return nil, fmt.Errorf("encoded (zstd, %d bytes): %w", len(frame), err)
	}
	if len(out) > MaxContentBytes {
		return nil, fmt.Errorf("encoded (zstd, %d bytes): expands past %d bytes", len(frame), MaxContentBytes)
	}
	return out, nil
}

// errNested: a message whose encoded content is itself encoded is refused (the broker never
// makes one; expanding it again would let a message expand without bound).
var errNested = errors.New("encoded: its content holds another encoded field")

// Expand merges the content of resp.encoded, if any, into resp and clears the field: resp is
// then the message the broker compressed (with any events of its own first).
func Expand(resp *apiv1.WatchResponse) error {
	frame := resp.GetEncoded()
	if len(frame) == 0 {
		return nil
	}
	content, err := Decode(frame)
	if err != nil {
		return err
	}
	resp.Encoded = nil
	if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(content, resp); err != nil {
		return fmt.Errorf("encoded: its content is not a watch message: %w", err)
	}
	if len(resp.GetEncoded()) > 0 {
		return errNested
	}
	return nil
}
