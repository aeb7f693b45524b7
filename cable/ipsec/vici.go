package ipsec

import (
	"context"
	"fmt"
	"net"
	"sort"
	"time"

	"github.com/strongswan/govici/vici"
)

// viciClient is the part of VICI the driver uses. The real one talks to charon's socket; tests
// use a fake that records the requests.
type viciClient interface {
	// call sends a command and returns its response as nested maps.
	call(ctx context.Context, cmd string, msg map[string]any) (map[string]any, error)
	// stream sends a streamed command and returns the events it produced.
	stream(ctx context.Context, cmd, event string, msg map[string]any) ([]map[string]any, error)
}

// defaultCallTimeout bounds a VICI exchange when ctx has no earlier deadline. govici takes no
// context, so the bound is a deadline on the socket.
const defaultCallTimeout = 30 * time.Second

// socketClient opens a session per request: charon may be restarted by the supervisor at any
// time, and a fresh unix-socket connection costs next to nothing.
type socketClient struct {
	path string
}

func (c socketClient) session(ctx context.Context) (*vici.Session, error) {
	deadline := time.Now().Add(defaultCallTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	dial := func(dctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", c.path)
		if err != nil {
			return nil, err
		}
		_ = conn.SetDeadline(deadline)
		return conn, nil
	}
	s, err := vici.NewSession(vici.WithDialContext(dial), vici.WithAddr("unix", c.path))
	if err != nil {
		return nil, fmt.Errorf("vici: connect to %s: %w", c.path, err)
	}
	return s, nil
}

// request sends cmd with msg on a fresh session and lets do read the answer.
func (c socketClient) request(ctx context.Context, cmd string, msg map[string]any, do func(*vici.Session, *vici.Message) error) error {
	req, err := toMessage(msg)
	if err != nil {
		return fmt.Errorf("vici %s: %w", cmd, err)
	}
	s, err := c.session(ctx)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := do(s, req); err != nil {
		return fmt.Errorf("vici %s: %w", cmd, err)
	}
	return nil
}

func (c socketClient) call(ctx context.Context, cmd string, msg map[string]any) (map[string]any, error) {
	var out map[string]any
	err := c.request(ctx, cmd, msg, func(s *vici.Session, req *vici.Message) error {
		resp, err := s.CommandRequest(cmd, req)
		if err != nil {
			return err
		}
		out = fromMessage(resp)
		return nil
	})
	return out, err
}

func (c socketClient) stream(ctx context.Context, cmd, event string, msg map[string]any) ([]map[string]any, error) {
	var out []map[string]any
	err := c.request(ctx, cmd, msg, func(s *vici.Session, req *vici.Message) error {
		msgs, err := s.StreamedCommandRequest(cmd, event, req)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if err := m.Err(); err != nil {
				return err
			}
			out = append(out, fromMessage(m))
		}
		return nil
	})
	return out, err
}

// toMessage converts nested maps (string, []string, map[string]any values) into a vici.Message
// with keys in sorted order, so the same map always gives the same bytes on the wire.
func toMessage(m map[string]any) (*vici.Message, error) {
	msg := vici.NewMessage()
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var v any
		switch x := m[k].(type) {
		case string, []string:
			v = x
		case map[string]any:
			sub, err := toMessage(x)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			v = sub
		default:
			return nil, fmt.Errorf("%s: unsupported value type %T", k, x)
		}
		if err := msg.Set(k, v); err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
	}
	return msg, nil
}

// fromMessage converts a vici.Message into nested maps.
func fromMessage(m *vici.Message) map[string]any {
	out := map[string]any{}
	if m == nil {
		return out
	}
	for _, k := range m.Keys() {
		switch v := m.Get(k).(type) {
		case *vici.Message:
			out[k] = fromMessage(v)
		default:
			out[k] = v
		}
	}
	return out
}
