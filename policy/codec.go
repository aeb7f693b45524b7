package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// A policy has one typed form, ClusterConnectionPolicy, and two encodings: YAML, what people
// write and cablectl reads (DecodeYAML, with line numbers in its errors), and JSON, what cablectl
// sends, the broker stores and the agents receive (apiv1.Policy.json). Every program reads the
// JSON with DecodeJSON and writes it with EncodeJSON, so the broker, the agent and cablectl agree
// on what a policy says, and on what they refuse.

// DecodeJSON reads one policy from its JSON, strictly: an unknown field is an error naming the
// field, and so is anything after the policy object. It does not validate (Validate does).
func DecodeJSON(b []byte) (ClusterConnectionPolicy, error) {
	var p ClusterConnectionPolicy
	if len(bytes.TrimSpace(b)) == 0 {
		return p, errors.New("json is empty")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return p, fmt.Errorf("json: %v", strings.TrimPrefix(err.Error(), "json: "))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return p, errors.New("json: data after the policy object")
	}
	return p, nil
}

// EncodeJSON writes p as DecodeJSON reads it.
func EncodeJSON(p *ClusterConnectionPolicy) ([]byte, error) {
	return json.Marshal(p)
}
