package broker

import (
	"log/slog"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Watch message sizes. An agent's gRPC client receives at most 4 MiB per message by default;
// the broker keeps every message under DefaultWatchMessageBytes, far below that, by sending a
// large batch in parts (WatchResponse.more). An event larger than the budget goes alone; one that
// no agent could receive (over maxWatchEventBytes, which only a resource stored before the API
// bounded its input can be) is left out and logged. A DELETE event carries its old value only
// when that is small: agents delete by key.
const (
	DefaultWatchMessageBytes = 1 << 20
	maxWatchEventBytes       = 4<<20 - 64<<10
	maxDeleteValueBytes      = 4 << 10
)

// messageBudget is Config.WatchMessageBytes or its default.
func (s *Server) messageBudget() int {
	if s.watchBudget > 0 {
		return s.watchBudget
	}
	return DefaultWatchMessageBytes
}

// sendBatch sends resp, one batch of a watch, as one message when it fits the budget, else in
// parts (splitBatch).
func (s *Server) sendBatch(stream apiv1.Agent_WatchServer, resp *apiv1.WatchResponse, log *slog.Logger) error {
	for _, m := range splitBatch(resp, s.messageBudget(), log) {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// splitBatch splits a watch batch into messages of at most budget bytes each (but for a single
// event larger than that, which goes alone). Every part but the last has more set. The parts of
// deltas carry the revision of their last event, so an agent that resumes from one loses
// nothing; the parts of a snapshot before the last carry revision 0 (and so do their events), so
// that an agent that stops in the middle of a snapshot asks for a new one. The imports and the CA
// bundle go with the last part, or in a last message of their own when they do not fit in it.
func splitBatch(resp *apiv1.WatchResponse, budget int, log *slog.Logger) []*apiv1.WatchResponse {
	evs := make([]*apiv1.Event, 0, len(resp.Events))
	for _, ev := range resp.Events {
		if ev.Type == apiv1.Event_DELETE && ev.Resource != nil && proto.Size(ev.Resource) > maxDeleteValueBytes {
			ev = &apiv1.Event{Type: ev.Type, Kind: ev.Kind, Key: ev.Key, Revision: ev.Revision}
		}
		if n := proto.Size(ev); n > maxWatchEventBytes {
			log.Error("a resource is too large for any agent to receive and is left out of the watch; delete it or apply it again within the API's limits",
				"kind", ev.Kind, "key", ev.Key, "bytes", n, "revision", ev.Revision)
			continue
		}
		evs = append(evs, ev)
	}
	tail := &apiv1.WatchResponse{Imports: resp.Imports, Ca: resp.Ca}
	tailSize := proto.Size(tail)
	if tailSize > maxWatchEventBytes {
		// The imports are one field the agent replaces whole: they cannot be split without the
		// agent's help. The API's bounds on exports keep them far below this in any mesh the
		// bounds were made for; say so loudly if one gets there.
		log.Error("the service imports of this agent are larger than an agent receives in one message; it will not get them",
			"bytes", tailSize, "limit", maxWatchEventBytes)
	}
	const overhead = 64 // the message's own fields
	if proto.Size(&apiv1.WatchResponse{Events: evs})+tailSize+overhead <= budget {
		return []*apiv1.WatchResponse{{Snapshot: resp.Snapshot, Events: evs, Revision: resp.Revision, Imports: resp.Imports, Ca: resp.Ca}}
	}
	var (
		parts []*apiv1.WatchResponse
		cur   []*apiv1.Event
		size  = overhead
	)
	flush := func() {
		parts = append(parts, &apiv1.WatchResponse{Events: cur, More: true})
		cur, size = nil, overhead
	}
	for _, ev := range evs {
		n := proto.Size(ev) + 8 // the field's tag and length
		if len(cur) > 0 && size+n > budget {
			flush()
		}
		cur = append(cur, ev)
		size += n
	}
	if len(cur) > 0 || len(parts) == 0 {
		parts = append(parts, &apiv1.WatchResponse{Events: cur, More: true})
	}
	if tail.Imports != nil || tail.Ca != nil {
		if size+tailSize <= budget {
			last := parts[len(parts)-1]
			last.Imports, last.Ca = tail.Imports, tail.Ca
		} else {
			parts = append(parts, &apiv1.WatchResponse{Imports: tail.Imports, Ca: tail.Ca, More: true})
		}
	}
	for i, m := range parts {
		m.Snapshot = resp.Snapshot && i == 0
		last := i == len(parts)-1
		switch {
		case last:
			m.More, m.Revision = false, resp.Revision
		case resp.Snapshot:
			m.Revision = 0
			// New events around the same resources: the store shares them between watchers.
			for j, ev := range m.Events {
				m.Events[j] = &apiv1.Event{Type: ev.Type, Kind: ev.Kind, Key: ev.Key, Resource: ev.Resource}
			}
		default:
			m.Revision = resp.Revision
			if n := len(m.Events); n > 0 {
				m.Revision = m.Events[n-1].Revision
			}
		}
	}
	return parts
}
