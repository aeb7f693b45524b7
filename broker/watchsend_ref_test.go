package broker

import (
	"log/slog"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// This file keeps the per-watcher encoding the broker used before watch batches were encoded once
// and shared (watchsend.go): the reference the shared encoding must equal byte for byte
// (TestSharedEncodingIsByteIdenticalToPerWatcher), and what the split tests check.

// splitBatch splits a watch batch into messages of at most budget bytes each (but for a single
// event larger than that, which goes alone). Every part but the last has more set. The parts of
// deltas carry the revision of their last event, so an agent that resumes from one loses
// nothing; the parts of a snapshot before the last carry revision 0 (and so do their events), so
// that an agent that stops in the middle of a snapshot asks for a new one. The imports and the CA
// bundle go with the last part, or in a last message of their own when they do not fit in it.
//
// Each event is sized once (proto.Size walks the whole message, maps included): while a fleet of
// 1,000 started at once, proto.Size was 40 % of the broker's CPU, most of it here, where every
// event of a batch was sized three times for every watcher (gRPC sizes the message once more
// before it encodes it).
func splitBatch(resp *apiv1.WatchResponse, budget int, log *slog.Logger) []*apiv1.WatchResponse {
	evs := make([]*apiv1.Event, 0, len(resp.Events))
	sizes := make([]int, 0, len(resp.Events)) // of each event in evs, as a field of the message
	eventsSize := 0
	for _, ev := range resp.Events {
		if ev.Type == apiv1.Event_DELETE && ev.Resource != nil && proto.Size(ev.Resource) > maxDeleteValueBytes {
			ev = &apiv1.Event{Type: ev.Type, Kind: ev.Kind, Key: ev.Key, Revision: ev.Revision}
		}
		n := proto.Size(ev)
		if n > maxWatchEventBytes {
			log.Error("a resource is too large for any agent to receive and is left out of the watch; delete it or apply it again within the API's limits",
				"kind", ev.Kind, "key", ev.Key, "bytes", n, "revision", ev.Revision)
			continue
		}
		evs = append(evs, ev)
		n += protowire.SizeTag(eventsField) + protowire.SizeVarint(uint64(n))
		sizes = append(sizes, n)
		eventsSize += n
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
	if eventsSize+tailSize+overhead <= budget {
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
	for i, ev := range evs {
		n := sizes[i]
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

// ownClusters replaces, in evs, every cluster upsert by a copy the caller may modify, and every
// endpoint by its copy without the broker's own fields (agentEndpoint).
func ownClusters(evs []*apiv1.Event) {
	for i, ev := range evs {
		if c := ev.GetResource().GetCluster(); c != nil && ev.Type == apiv1.Event_UPSERT {
			evs[i] = &apiv1.Event{Type: ev.Type, Kind: ev.Kind, Key: ev.Key, Revision: ev.Revision,
				Resource: &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: proto.Clone(c).(*apiv1.Cluster)}}}
		}
		if e := ev.GetResource().GetEndpoint(); e != nil {
			e = proto.Clone(e).(*apiv1.Endpoint)
			e.CertificateSerial, e.LastHeartbeat, e.LeaseExpires, e.LeaseSeconds = "", nil, nil, 0
			evs[i] = &apiv1.Event{Type: ev.Type, Kind: ev.Kind, Key: ev.Key, Revision: ev.Revision,
				Resource: &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: e}}}
		}
	}
}

// addPairPSKs gives every cluster UPSERT in evs, other than the watcher's own cluster self (of
// UID selfUID), the PSK of the pair (self, that cluster). evs must be the watcher's own copies.
func (s *Server) addPairPSKs(self, selfUID string, evs []*apiv1.Event) {
	for _, ev := range evs {
		if ev.Type != apiv1.Event_UPSERT {
			continue
		}
		if c := ev.GetResource().GetCluster(); c != nil && c.Name != self {
			c.PairPsk = PairPSK(s.meshSecret, selfUID, c.Uid)
		}
	}
}
