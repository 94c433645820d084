package etcdlock

import (
	"context"
	"strconv"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"tenace.dev/tenace"
)

// SupportsShared reports true: Acquire honours LockAcquireOptions.Shared
// and Permits (see "Shared locks and permits" in the package doc).
func (p *Provider) SupportsShared() bool { return true }

// sharedMark starts the name of a shared entry after the queue's prefix.
// Exclusive entries are named by their lease ID in hex, the names older
// versions read (0-9, a-f: all below "s"), so that the exclusive entries of
// a queue are the range [dir, dir+"s") and the shared ones dir+"s"….
const sharedMark = "s"

// entryName is the etcd key of a caller's entry in the queue dir.
// The ID is in hex, 16 digits (etcd's lease IDs are positive).
func entryName(dir string, id clientv3.LeaseID, shared bool) string {
	b := make([]byte, 0, len(dir)+len(sharedMark)+16)
	b = append(b, dir...)
	if shared {
		b = append(b, sharedMark...)
	}
	var digits [16]byte
	hex := strconv.AppendUint(digits[:0], uint64(id), 16)
	for range 16 - len(hex) {
		b = append(b, '0')
	}
	return string(append(b, hex...))
}

// entryValue is the value of a caller's entry: empty for an exclusive one,
// the permit count asked for (in decimal) for a shared one; its owner
// follows (see ownerValue), which versions before owners did not write.
func entryValue(opts tenace.LockAcquireOptions) string {
	if !opts.Shared {
		return ""
	}
	return strconv.Itoa(opts.Permits)
}

// view is what a caller reads of its queue to know whether it is admitted:
// the entries created before its own (all others, when it reads with its
// put, or before it has one).
type view struct {
	// last: exclusive callers: an entry before the caller's (the head when
	// read with the put, the predecessor when waiting), nil if none.
	last *mvccpb.KeyValue
	// Shared callers: the head of the queue, the last exclusive entry
	// before the caller's, and every entry before it (keys only).
	head, excl *mvccpb.KeyValue
	before     []*mvccpb.KeyValue
}

// viewOps are the reads of a caller's view of dir: of the entries created
// at or before maxRev, or of all when maxRev is 0 (the queueing Txn, whose
// put is the newest entry, and the peek, which may run before the put);
// serializable for the peek.
func (a *attempt) viewOps(dir string, maxRev int64, serializable bool) []clientv3.Op {
	opt := func(o ...clientv3.OpOption) []clientv3.OpOption {
		if maxRev > 0 {
			o = append(o, clientv3.WithMaxCreateRev(maxRev))
		}
		if serializable {
			o = append(o, clientv3.WithSerializable())
		}
		return o
	}
	if !a.opts.Shared {
		if maxRev == 0 {
			return []clientv3.Op{clientv3.OpGet(dir, opt(clientv3.WithFirstCreate()...)...)}
		}
		return []clientv3.Op{clientv3.OpGet(dir, opt(clientv3.WithLastCreate()...)...)}
	}
	headOpts := clientv3.WithFirstCreate()
	if serializable {
		headOpts = append(headOpts, clientv3.WithSerializable())
	}
	return []clientv3.Op{
		clientv3.OpGet(dir, headOpts...),
		clientv3.OpGet(dir, opt(clientv3.WithRange(dir+sharedMark), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1))...),
		// A count of the keys: etcd counts a range before it applies
		// the create-revision filter, so CountOnly would count them all.
		clientv3.OpGet(dir, opt(clientv3.WithPrefix(), clientv3.WithKeysOnly())...),
	}
}

// view reads the replies to viewOps.
func (a *attempt) view(rs []*pb.ResponseOp) view {
	first := func(i int) *mvccpb.KeyValue {
		if kvs := rs[i].GetResponseRange().Kvs; len(kvs) > 0 {
			return kvs[0]
		}
		return nil
	}
	if !a.opts.Shared {
		return view{last: first(0)}
	}
	return view{head: first(0), excl: first(1), before: rs[2].GetResponseRange().Kvs}
}

// without is v less the entry of the etcd lease own (0: none): a caller is
// not in its own way.
func (v view) without(own clientv3.LeaseID) view {
	drop := func(kv *mvccpb.KeyValue) *mvccpb.KeyValue {
		if kv != nil && own != 0 && clientv3.LeaseID(kv.Lease) == own {
			return nil
		}
		return kv
	}
	out := view{last: drop(v.last), head: drop(v.head), excl: drop(v.excl)}
	for _, kv := range v.before {
		if drop(kv) != nil {
			out.before = append(out.before, kv)
		}
	}
	return out
}

// limit is the permit count in force for a shared caller: that of the
// head of the queue when it is shared (the oldest holder's: the first
// shared holder's count wins), else the caller's own.
func (v view) limit(opts tenace.LockAcquireOptions) int {
	if v.head != nil && len(v.head.Value) > 0 {
		if n, err := strconv.Atoi(permitsOf(v.head.Value)); err == nil && n >= 0 {
			return n
		}
	}
	return opts.Permits
}

// admits reports whether a caller with opts is granted, given its view: an
// exclusive caller when no entry is before it; a shared one when no
// exclusive entry is before it and, with a limit of N > 0, fewer than N
// entries are (grants go in queue order, so those are the holders, and
// the waiters that will hold before it).
func (v view) admits(opts tenace.LockAcquireOptions) bool {
	if !opts.Shared {
		return v.last == nil
	}
	if v.excl != nil {
		return false
	}
	n := v.limit(opts)
	return n == 0 || len(v.before) < n
}

// waitFor waits, from rev on, for the change in dir that may admit the
// caller, v being its view (which does not admit it): the deletion of the
// entry before it, for an exclusive caller; for a shared one, of the last
// exclusive entry before it, or else of enough of the entries before it to
// bring them under the limit (or of the head, whose count may differ).
// The caller then reads its view again.
func (a *attempt) waitFor(dir string, v view, rev int64) {
	switch {
	case !a.opts.Shared:
		a.waitEvents(string(v.last.Key), rev, nil, func(*clientv3.Event) bool { return true })
		return
	case v.excl != nil:
		a.waitEvents(string(v.excl.Key), rev, nil, func(*clientv3.Event) bool { return true })
		return
	}
	need := len(v.before) - v.limit(a.opts) + 1
	var head string
	if v.head != nil {
		head = string(v.head.Key)
	}
	a.waitEvents(dir, rev, []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithPrevKV()}, func(ev *clientv3.Event) bool {
		if ev.PrevKv == nil || ev.PrevKv.CreateRevision < a.l.rev {
			need--
		}
		return need <= 0 || string(ev.Kv.Key) == head
	})
}

// waitEvents watches key (with opts) for deletions from rev on, until done
// says one is the change waited for, or the watch ends for another reason
// (a compaction, a member lost), or a renewal interval passed — the
// caller then looks at the queue again — or the wait ends, or the
// caller's lease is lost (the driver reads which).
func (a *attempt) waitEvents(key string, rev int64, opts []clientv3.OpOption, done func(*clientv3.Event) bool) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(a.wctx))
	defer cancel()
	// A watch served by a member that stalled (SIGSTOP, a partition: its
	// connection stays open) brings nothing: one that etcd has not
	// confirmed within hedgeAfter (Watch returns once it has) is
	// cancelled, and the caller looks again — a read that moves to a live
	// member (see hedge), then a watch on a new stream once no watch is
	// left on the stalled one. A confirmed watch whose member stalls
	// later is caught by a look every renewal interval.
	unconfirmed := time.AfterFunc(hedgeAfter, cancel)
	wch := a.p.client.Watch(wctx, key, append(opts, clientv3.WithRev(rev), clientv3.WithFilterPut())...)
	if !unconfirmed.Stop() && a.wctx.Err() == nil {
		a.unprompted = true
		return
	}
	recheck := time.NewTimer(a.p.interval)
	defer recheck.Stop()
	for {
		select {
		case <-recheck.C:
			a.unprompted = true
			return
		case <-a.l.Lost():
			return
		case <-a.wctx.Done():
			return
		case wr, ok := <-wch:
			if !ok || wr.Canceled || wr.Err() != nil {
				return // look again, or the wait ended
			}
			for _, ev := range wr.Events {
				if done(ev) {
					return
				}
			}
		}
	}
}
