package store

import (
	"encoding/hex"
	"sort"
	"strings"

	"github.com/google/btree"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The key-value space of a transaction over the mirror (etcdTxnKV): the etcd keys of the
// buckets, the reads it records, and the conditions and operations of its commit.

// key is the etcd key of a bucket's key: event keys are hex, the others are text already.
func (s *Etcd) key(bucket, key []byte) string {
	if string(bucket) == string(bucketEvents) {
		return s.prefix + string(bucket) + "/" + hex.EncodeToString(key)
	}
	return s.prefix + string(bucket) + "/" + string(key)
}

// bucketRange is [start, end) of a bucket's keys.
func (s *Etcd) bucketRange(bucket []byte) (string, string) {
	start := s.prefix + string(bucket) + "/"
	return start, s.prefix + string(bucket) + "0" // '0' follows '/'
}

// bucketKey turns an etcd key of bucket back into the bucket's key.
func (s *Etcd) bucketKey(bucket []byte, full string) []byte {
	k := strings.TrimPrefix(full, s.prefix+string(bucket)+"/")
	if string(bucket) == string(bucketEvents) {
		b, err := hex.DecodeString(k)
		if err == nil {
			return b
		}
	}
	return []byte(k)
}

func (s *Etcd) readKV(st *etcdState) *etcdTxnKV {
	return &etcdTxnKV{s: s, base: st, tree: st.tree}
}

// etcdTxnKV is the kv of one transaction over a mirror state. A writable one records what it
// read (for the commit's conditions) and what it wrote (the commit's operations); its first
// write clones the tree (lazily: copy on write), so the state others read never changes.
type etcdTxnKV struct {
	s      *Etcd
	base   *etcdState
	tree   *btree.BTreeG[etcdItem]
	track  bool
	cloned bool
	reads  map[string]int64   // etcd key -> mod revision seen (0: absent)
	scans  map[string]string  // bucket range start -> end, for buckets listed
	writes map[string]*[]byte // etcd key -> value, nil for a delete
}

func (k *etcdTxnKV) get(bucket, key []byte) []byte {
	full := k.s.key(bucket, key)
	it, ok := k.tree.Get(etcdItem{key: full})
	if k.track {
		if _, wrote := k.writes[full]; !wrote {
			if _, seen := k.reads[full]; !seen {
				if k.reads == nil {
					k.reads = map[string]int64{}
				}
				k.reads[full] = it.mod // 0 when absent
			}
		}
	}
	if !ok {
		return nil
	}
	return it.value
}

// peek reads key as get does, but records no read: the transaction's commit does not compare it.
func (k *etcdTxnKV) peek(bucket, key []byte) []byte {
	it, ok := k.tree.Get(etcdItem{key: k.s.key(bucket, key)})
	if !ok {
		return nil
	}
	return it.value
}

func (k *etcdTxnKV) write(full string, v *[]byte) {
	if !k.cloned {
		// Clone marks the shared nodes read-only in the tree it clones: two transactions on
		// one state must not do it at once (reads of that state are not affected).
		k.s.cloneMu.Lock()
		k.tree = k.tree.Clone()
		k.s.cloneMu.Unlock()
		k.cloned = true
	}
	if k.writes == nil {
		k.writes = map[string]*[]byte{}
	}
	k.writes[full] = v
}

func (k *etcdTxnKV) put(bucket, key, value []byte) error {
	if !k.track {
		return errReadOnly
	}
	full := k.s.key(bucket, key)
	k.write(full, &value)
	k.tree.ReplaceOrInsert(etcdItem{key: full, value: value, mod: -1})
	return nil
}

func (k *etcdTxnKV) delete(bucket, key []byte) error {
	if !k.track {
		return errReadOnly
	}
	full := k.s.key(bucket, key)
	if _, ok := k.tree.Get(etcdItem{key: full}); !ok {
		if _, wrote := k.writes[full]; !wrote {
			return nil
		}
	}
	k.write(full, nil)
	k.tree.Delete(etcdItem{key: full})
	return nil
}

func (k *etcdTxnKV) scan(bucket, from []byte, fn func(k, v []byte) error) error {
	start, end := k.s.bucketRange(bucket)
	if k.track {
		if k.scans == nil {
			k.scans = map[string]string{}
		}
		k.scans[start] = end
	}
	if from != nil {
		start = k.s.key(bucket, from)
	}
	var err error
	k.tree.AscendRange(etcdItem{key: start}, etcdItem{key: end}, func(it etcdItem) bool {
		err = fn(k.s.bucketKey(bucket, it.key), it.value)
		return err == nil
	})
	return err
}

// maxPointCompares is how many keys of one bucket the conditions compare one by one; beyond it
// the whole bucket is compared (etcd limits a transaction to --max-txn-ops comparisons).
const maxPointCompares = 16

// conditions are the comparisons a commit needs for what the transaction read to be unchanged,
// and the reads that, when they fail, tell how far the mirror must catch up before a retry.
func (k *etcdTxnKV) conditions(bumpsRevision bool) (cmps []clientv3.Cmp, failure []clientv3.Op) {
	metaKey := k.s.key(bucketMeta, keyRevision)
	scans := map[string]string{}
	for start, end := range k.scans {
		scans[start] = end
	}
	// Keys read one by one, per bucket range, unless their bucket was listed anyway.
	perBucket := map[string][]string{}
	for full := range k.reads {
		if full == metaKey {
			continue
		}
		start := k.rangeOf(full)
		if _, listed := scans[start]; listed {
			continue
		}
		perBucket[start] = append(perBucket[start], full)
	}
	for start, keys := range perBucket {
		if len(keys) > maxPointCompares {
			scans[start] = start[:len(start)-1] + "0"
			continue
		}
		for _, full := range keys {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(full), "=", k.reads[full]))
			failure = append(failure, clientv3.OpGet(full, clientv3.WithKeysOnly()))
		}
	}
	// A listed bucket: no key in it is newer than the mirror (a put), and its delete marker is
	// as the mirror has it (a range comparison cannot see a key that is gone).
	for start, end := range scans {
		marker := k.s.deletedMarker(start)
		it, _ := k.base.tree.Get(etcdItem{key: marker})
		cmps = append(cmps,
			clientv3.Compare(clientv3.ModRevision(start).WithRange(end), "<", k.base.rev+1),
			clientv3.Compare(clientv3.ModRevision(marker), "=", it.mod))
		failure = append(failure,
			clientv3.OpGet(start, clientv3.WithRange(end), clientv3.WithKeysOnly(),
				clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend), clientv3.WithLimit(1)),
			clientv3.OpGet(marker, clientv3.WithKeysOnly()))
	}
	// Every commit that bumps the revision writes meta/revision: comparing it orders them (and
	// so allocates every revision once). A quiet write (a heartbeat) needs no such order.
	if bumpsRevision {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(metaKey), "=", k.reads[metaKey]))
	}
	failure = append(failure, clientv3.OpGet(metaKey, clientv3.WithKeysOnly()))
	return cmps, failure
}

// deletedMarker is the key every commit that deletes in the bucket of range start rewrites.
func (s *Etcd) deletedMarker(start string) string {
	b := strings.TrimSuffix(strings.TrimPrefix(start, s.prefix), "/")
	return s.prefix + string(bucketMeta) + "/deleted/" + b
}

// rangeOf is the start of the bucket range an etcd key of the prefix lies in.
func (k *etcdTxnKV) rangeOf(full string) string {
	rest := strings.TrimPrefix(full, k.s.prefix)
	b, _, _ := strings.Cut(rest, "/")
	return k.s.prefix + b + "/"
}

// ops are the commit's writes: puts, deletes, and consecutive deletes of the event log (the log
// trimmed) as one range.
func (k *etcdTxnKV) ops() []clientv3.Op {
	keys := make([]string, 0, len(k.writes))
	for full := range k.writes {
		keys = append(keys, full)
	}
	sort.Strings(keys)
	var (
		ops          []clientv3.Op
		runStart     string
		runEnd       uint64
		runLen       int
		eventsPrefix = k.s.prefix + string(bucketEvents) + "/"
	)
	flush := func() {
		if runLen == 0 {
			return
		}
		if runLen == 1 {
			ops = append(ops, clientv3.OpDelete(runStart))
		} else {
			ops = append(ops, clientv3.OpDelete(runStart, clientv3.WithRange(k.s.key(bucketEvents, u64Key(runEnd+1)))))
		}
		runLen = 0
	}
	deleted := map[string]bool{}
	for _, full := range keys {
		v := k.writes[full]
		if v == nil {
			deleted[k.rangeOf(full)] = true
		}
		if v == nil && strings.HasPrefix(full, eventsPrefix) {
			r := binaryRev(k.s.bucketKey(bucketEvents, full))
			if runLen > 0 && r == runEnd+1 {
				runEnd, runLen = r, runLen+1
				continue
			}
			flush()
			runStart, runEnd, runLen = full, r, 1
			continue
		}
		flush()
		if v == nil {
			ops = append(ops, clientv3.OpDelete(full))
		} else {
			ops = append(ops, clientv3.OpPut(full, string(*v)))
		}
	}
	flush()
	for start := range deleted {
		ops = append(ops, clientv3.OpPut(k.s.deletedMarker(start), ""))
	}
	return append(ops, clientv3.OpPut(k.s.key(bucketMeta, keyCommitted), ""))
}

// keyCommitted is the meta key every commit rewrites (see Etcd).
var keyCommitted = []byte("committed")

func binaryRev(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	var r uint64
	for _, c := range b {
		r = r<<8 | uint64(c)
	}
	return r
}
