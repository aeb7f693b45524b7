package store

import "strings"

// groupTxn is the union of the transactions of a group (commitOnce) as it grows, one Update at
// a time: the keys they read, listed and wrote (all), and the sizes etcd limits (comparisons,
// operations, bytes), kept up to date as each Update is added. Counting them afresh for every
// Update, by building the transaction's comparisons and operations (sorting every key, copying
// every value), was O(n²) in the group: a committer that spent its time counting could not send
// groups as large as etcd takes. The transaction itself is built once, from all.
//
// The counts are exactly those of all.conditions and all.ops: a key read one by one is a
// comparison unless its bucket is listed (then the bucket's two are), and a bucket with more
// than maxPointCompares such keys is compared whole (two); the failure branch reads each of
// those, and meta/revision; every write is an operation, but the
// deletes of consecutive events (the log trimmed), which are one; every bucket with a delete adds
// its delete marker, and every commit its meta/committed.
type groupTxn struct {
	all          *etcdTxnKV
	metaKey      string
	eventsPrefix string
	points       map[string]int  // bucket start -> keys read one by one in it (meta/revision aside)
	deletes      map[string]int  // bucket start -> keys deleted in it
	eventDeletes map[uint64]bool // revisions of the events deleted
	pointCmps    int             // the comparisons of the keys read one by one
	eventRuns    int             // runs of consecutive events deleted
	otherOps     int             // writes but the events deleted
	deleted      int             // buckets with a delete
	bytes        int             // keys and values written
	undo         []func()        // how to take back the Update being added (add)
}

func newGroupTxn(s *Etcd, st *etcdState) *groupTxn {
	return &groupTxn{
		all: &etcdTxnKV{s: s, base: st, tree: st.tree, track: true,
			reads: map[string]int64{}, scans: map[string]string{}, writes: map[string]*[]byte{}},
		metaKey:      s.key(bucketMeta, keyRevision),
		eventsPrefix: s.prefix + string(bucketEvents) + "/",
		points:       map[string]int{}, deletes: map[string]int{}, eventDeletes: map[uint64]bool{},
	}
}

// groupSize is what etcd limits of one transaction.
type groupSize struct{ cmps, failure, ops, bytes int }

// size is the size of the transaction of g (bumps: it writes meta/revision, compared).
func (g *groupTxn) size(bumps bool) groupSize {
	scans := 2 * len(g.all.scans)
	// The failure branch reads meta/revision too, whether compared or not.
	z := groupSize{cmps: g.pointCmps + scans, failure: g.pointCmps + scans + 1, ops: g.eventRuns + g.otherOps + g.deleted + 1, bytes: g.bytes}
	if bumps {
		z.cmps++
	}
	return z
}

func (z groupSize) exceeds(maxOps, maxBytes int) bool {
	return z.cmps > maxOps || z.failure > maxOps || z.ops > maxOps || z.bytes > maxBytes
}

// pointsCost is what the keys read one by one in bucket b compare: none when b is listed, else
// each, or two when there are more than maxPointCompares (the bucket is compared whole).
func (g *groupTxn) pointsCost(b string) int {
	if _, listed := g.all.scans[b]; listed {
		return 0
	}
	if p := g.points[b]; p <= maxPointCompares {
		return p
	}
	return 2
}

// add adds the reads and writes of o, which ran after every Update g holds, on their writes: a
// key o read that one of them wrote is not a condition (the group writes it), and a key read
// before keeps the mod revision it was first read with. drop takes it back, until the next add.
func (g *groupTxn) add(o *etcdTxnKV) {
	g.undo = g.undo[:0]
	for key, mod := range o.reads {
		if _, wrote := g.all.writes[key]; wrote {
			continue
		}
		if _, seen := g.all.reads[key]; seen {
			continue
		}
		g.addRead(key, mod)
		g.undo = append(g.undo, func() { g.dropRead(key) })
	}
	for start, end := range o.scans {
		if _, listed := g.all.scans[start]; listed {
			continue
		}
		g.addScan(start, end)
		g.undo = append(g.undo, func() { g.dropScan(start) })
	}
	for key, v := range o.writes {
		old, had := g.all.writes[key]
		if had {
			g.unwrite(key, old)
		}
		g.write(key, v)
		g.undo = append(g.undo, func() {
			g.unwrite(key, v)
			if had {
				g.write(key, old)
			}
		})
	}
}

// drop takes back the last add.
func (g *groupTxn) drop() {
	for i := len(g.undo) - 1; i >= 0; i-- {
		g.undo[i]()
	}
	g.undo = g.undo[:0]
}

func (g *groupTxn) addRead(key string, mod int64) {
	g.all.reads[key] = mod
	if key == g.metaKey {
		return
	}
	b := g.all.rangeOf(key)
	was := g.pointsCost(b)
	g.points[b]++
	g.pointCmps += g.pointsCost(b) - was
}

func (g *groupTxn) dropRead(key string) {
	delete(g.all.reads, key)
	if key == g.metaKey {
		return
	}
	b := g.all.rangeOf(key)
	was := g.pointsCost(b)
	if g.points[b]--; g.points[b] == 0 {
		delete(g.points, b)
	}
	g.pointCmps += g.pointsCost(b) - was
}

func (g *groupTxn) addScan(start, end string) {
	was := g.pointsCost(start)
	g.all.scans[start] = end
	g.pointCmps -= was
}

func (g *groupTxn) dropScan(start string) {
	delete(g.all.scans, start)
	g.pointCmps += g.pointsCost(start)
}

// write records key's write (v nil: a delete) in all and in the counts.
func (g *groupTxn) write(key string, v *[]byte) {
	g.all.writes[key] = v
	g.bytes += len(key)
	if v != nil {
		g.bytes += len(*v)
		g.otherOps++
		return
	}
	b := g.all.rangeOf(key)
	if g.deletes[b]++; g.deletes[b] == 1 {
		g.deleted++
	}
	if !strings.HasPrefix(key, g.eventsPrefix) {
		g.otherOps++
		return
	}
	r := binaryRev(g.all.s.bucketKey(bucketEvents, key))
	g.eventDeletes[r] = true
	g.eventRuns += 1 - runNeighbours(g.eventDeletes, r)
}

// unwrite takes back write(key, v).
func (g *groupTxn) unwrite(key string, v *[]byte) {
	delete(g.all.writes, key)
	g.bytes -= len(key)
	if v != nil {
		g.bytes -= len(*v)
		g.otherOps--
		return
	}
	b := g.all.rangeOf(key)
	if g.deletes[b]--; g.deletes[b] == 0 {
		delete(g.deletes, b)
		g.deleted--
	}
	if !strings.HasPrefix(key, g.eventsPrefix) {
		g.otherOps--
		return
	}
	r := binaryRev(g.all.s.bucketKey(bucketEvents, key))
	delete(g.eventDeletes, r)
	g.eventRuns -= 1 - runNeighbours(g.eventDeletes, r)
}

// runNeighbours is how many of r's neighbours (r-1, r+1) are in set: adding r to set joins that
// many runs to its own.
func runNeighbours(set map[uint64]bool, r uint64) int {
	n := 0
	if r > 0 && set[r-1] {
		n++
	}
	if set[r+1] {
		n++
	}
	return n
}
