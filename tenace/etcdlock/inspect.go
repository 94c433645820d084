package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/keyfmt"
)

var _ tenace.Inspector = (*Provider)(nil)

// WithOwner sets the provider's owner label, recorded with every grant it
// makes and shown by Inspect, List and a refusal's holder (a pod name, a
// job id); by default tenace.DefaultOwner(). A Lock's own label
// (tenace.LockOptions.Owner) follows it, as "owner (label)". It panics if
// label is empty.
//
// The owner is written in the value of the caller's queue entry, after
// the permit count the value held before (which older versions still
// read: a shared head's count they cannot parse, they replace with their
// own caller's), with the time the caller joined the queue.
func WithOwner(label string) Option {
	if label == "" {
		panic("tenace: etcdlock.WithOwner: the owner label must not be empty")
	}
	return optionFunc(func(p *Provider) { p.owner = label })
}

// Owner returns the provider's owner label (see WithOwner).
func (p *Provider) Owner() string { return p.owner }

// ownerValue is an entry's value: permits (see entryValue), then a
// newline, the time the caller joins the queue in ms since 1970 (this
// process's clock), a newline, and its owner (the provider's label, and the
// caller's after it when it gave one).
func (p *Provider) ownerValue(permits, label string) string {
	b := make([]byte, 0, len(permits)+len(p.owner)+len(label)+24)
	b = append(b, permits...)
	b = append(b, '\n')
	b = strconv.AppendInt(b, time.Now().UnixMilli(), 10)
	b = append(b, '\n')
	b = append(b, p.owner...)
	if label != "" {
		b = append(append(append(b, " ("...), label...), ')')
	}
	return string(b)
}

// permitsOf is the permit count part of an entry's value: all of a value
// written before owners, the part before the first newline after.
func permitsOf(value []byte) string {
	s := string(value)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// ownerOf reads an entry's owner and queue time from its value; "" and the
// zero Time for an entry written before owners.
func ownerOf(value []byte) (string, time.Time) {
	_, rest, ok := strings.Cut(string(value), "\n")
	if !ok {
		return "", time.Time{}
	}
	ms, owner, ok := strings.Cut(rest, "\n")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil {
		return "", time.Time{}
	}
	return owner, time.UnixMilli(n)
}

// onHeld calls f with the head of the queue the caller saw when it joined
// (the holder, or the first of the holders).
func (a *attempt) onHeld(f func(tenace.HolderInfo)) {
	if a.heldBy == nil {
		return
	}
	f(a.p.holderOf(a.heldBy, a.heldBy))
}

// holderOf describes kv, an entry admitted under head, the queue's head.
func (p *Provider) holderOf(kv, head *mvccpb.KeyValue) tenace.HolderInfo {
	h := tenace.HolderInfo{Token: uint64(kv.CreateRevision), Shared: isShared(kv)}
	h.Owner, h.Since = ownerOf(kv.Value)
	if h.Shared {
		h.Permits, _ = strconv.Atoi(permitsOf(head.Value))
	}
	return h
}

// isShared reports whether kv is a shared caller's entry (see entryName).
func isShared(kv *mvccpb.KeyValue) bool {
	k := string(kv.Key)
	i := strings.LastIndexByte(k, '/')
	return i >= 0 && strings.HasPrefix(k[i+1:], sharedMark)
}

// maxEntries bounds the entries of one queue Inspect and List read: the
// holders and the oldest waiters; Waiting still counts them all.
const maxEntries = 1000

// queueOp reads the queue of key (see queueOptions).
func (p *Provider) queueOp(key string) clientv3.Op {
	return clientv3.OpGet(p.dir(key), queueOptions()...)
}

// readQueue turns a queue (entries oldest first, count of them all) into
// a KeyInfo: the holders are the entries the admission rule admits (see
// view.admits) — the head, and the shared entries after it up to the
// first exclusive one and within the head's count — the rest wait.
func (p *Provider) readQueue(key string, kvs []*mvccpb.KeyValue, count int64, now time.Time) tenace.KeyInfo {
	info := tenace.KeyInfo{Key: key}
	if len(kvs) == 0 {
		return info
	}
	head := kvs[0]
	limit := 0
	if isShared(head) {
		limit, _ = strconv.Atoi(permitsOf(head.Value))
	}
	held := true
	for i, kv := range kvs {
		shared := isShared(kv)
		if i > 0 && (!shared || !isShared(head) || limit > 0 && i >= limit) {
			held = false
		}
		if held {
			info.Holders = append(info.Holders, p.holderOf(kv, head))
			continue
		}
		owner, since := ownerOf(kv.Value)
		info.Waiters = append(info.Waiters, tenace.WaiterInfo{Owner: owner, Shared: shared, Since: since})
		if info.LongestWait == 0 && !since.IsZero() {
			info.LongestWait = max(now.Sub(since), 0)
		}
	}
	info.Waiting = int(count) - len(info.Holders)
	return info
}

// Inspect reports key's holders and waiters (tenace.Inspector): one
// linearizable range read of its queue (at most 1000 entries, oldest
// first; Waiting counts them all), then one lease lookup per holder for
// its expiry, 16 in flight at a time (no Raft write nor disk read: the
// leader answers from its memory). It never changes a lock.
//
// The holders are the entries at the head of the queue that the admission
// rule admits (the grants etcd decided); each names its owner (see
// WithOwner; "" for an entry of an older version), its fencing Token (the
// entry's create revision), Since (when it joined the queue, on its
// process's clock: its grant, for a caller granted at once, else earlier),
// and Expires (the end of its etcd lease's current TTL, moved on by every
// keepalive; up to a second early, as etcd rounds the time left down;
// the time of the look for a lease that ended meanwhile). The waiters
// follow in queue order, with their owners and when they began to wait;
// LongestWait is the oldest one's.
//
// An outage is an error, as in Acquire: a cluster that cannot be reached
// is ErrUnreachable (wrapping the dial's error, such as
// syscall.ECONNREFUSED), one that does not answer before ctx ends an error
// wrapping tenace.ErrNoReply. It panics on a nil ctx; an empty key is an
// error wrapping tenace.ErrMissingKey.
func (p *Provider) Inspect(ctx context.Context, key string) (tenace.KeyInfo, error) {
	if ctx == nil {
		panic("tenace: etcdlock.Provider.Inspect: nil ctx")
	}
	if key == "" {
		return tenace.KeyInfo{}, fmt.Errorf("etcdlock: Inspect: %w", tenace.ErrMissingKey)
	}
	if p.closed.Err() != nil {
		return tenace.KeyInfo{}, errClosed
	}
	what := "inspecting " + keyfmt.Quote(key)
	if err := p.reachRead(ctx, what); err != nil {
		return tenace.KeyInfo{}, err
	}
	resp, err := p.client.Get(ctx, p.dir(key), queueOptions()...)
	if err != nil {
		return tenace.KeyInfo{}, readFailed(ctx, what, err)
	}
	info := p.readQueue(key, resp.Kvs, resp.Count, time.Now())
	if err := p.expiries(ctx, []tenace.KeyInfo{info}, [][]*mvccpb.KeyValue{resp.Kvs}); err != nil {
		return tenace.KeyInfo{}, readFailed(ctx, what, err)
	}
	return info, nil
}

// expiries sets the Expires of the holders of keys, from their queues
// (oldest first, as readQueue read them): one lease lookup
// (LeaseTimeToLive) per holder — every entry has an etcd lease of its own
// —, lookupsInFlight at a time. A lookup is no Raft write nor disk read:
// the leader answers from its memory (a follower asks it first). etcd
// gives the time left in whole seconds, rounded down, and Expires counts
// it from before the lookup was sent: up to a second early, never late. A
// lease that etcd no longer has (expired or revoked since the read) gives
// Expires the time of the lookup — the grant has ended, never "no
// expiry"; an entry put with no lease by hand leaves Expires zero. A
// lookup that fails fails the call.
func (p *Provider) expiries(ctx context.Context, keys []tenace.KeyInfo, queues [][]*mvccpb.KeyValue) error {
	type lookup struct {
		h  *tenace.HolderInfo
		id clientv3.LeaseID
	}
	var todo []lookup
	for i := range keys {
		for j := range keys[i].Holders {
			if id := clientv3.LeaseID(queues[i][j].Lease); id != clientv3.NoLease {
				todo = append(todo, lookup{&keys[i].Holders[j], id})
			}
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	slots := make(chan struct{}, lookupsInFlight)
	for _, l := range todo {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-slots }()
			sent := time.Now()
			resp, err := p.client.TimeToLive(ctx, l.id)
			switch {
			case err != nil:
				cancel(err)
			case resp.TTL < 0: // etcd no longer has it, or it has run out: the grant has ended
				l.h.Expires = sent
			default:
				l.h.Expires = sent.Add(time.Duration(resp.TTL) * time.Second)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return nil
}

// lookupsInFlight bounds the lease lookups of one call of expiries in
// flight at once.
const lookupsInFlight = 16

// maxLookups bounds the lease lookups of one page of List: the holders of
// its keys (one each for exclusive keys; a shared key's readers or permits
// each one more).
const maxLookups = 100

// queueOptions read a queue, oldest first, maxEntries at most.
func queueOptions() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(maxEntries)}
}

// reachRead is reach for a read: the error says what failed.
func (p *Provider) reachRead(ctx context.Context, what string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := p.reach(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrUnreachable):
		return fmt.Errorf("%w (%s)", err, what)
	default:
		return readFailed(ctx, what, err)
	}
}

// readFailed words the error of a read: the caller's cancellation as
// itself, a deadline with no answer as tenace.ErrNoReply, else wrapped.
func readFailed(ctx context.Context, what string, err error) error {
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("etcdlock: %s: %w", what, ctx.Err())
	case ctx.Err() != nil:
		return fmt.Errorf("%w: etcdlock: %s: etcd did not answer before the context ended; retry with a later deadline, and if it persists, check that a quorum of the cluster runs and answers (%v)", tenace.ErrNoReply, what, err)
	}
	return fmt.Errorf("etcdlock: %s: %w", what, err)
}

// unescaper undoes dir's escape of a key.
var unescaper = strings.NewReplacer("%2F", "/", "%25", "%")

// List returns one page of the keys held or waited for under opts.Prefix
// (tenace.Inspector), in the order of their etcd names, each with what
// Inspect says of it: one range read of the entries' names (at most 10 ×
// Limit), one transaction that reads the page's queues (Limit at most 100,
// etcd's default bound on a transaction's operations; 100 when 0), then
// one lease lookup per holder for its Expires, as Inspect's. The lookups
// are most of a page's cost: a page of 100 held keys took 2.5-3.5ms
// without them and 23-27ms with them, on one member on a loaded 2-core
// machine (about 0.2ms a lookup; bench/README.md, "etcd op by op").
// A page makes at most 100 lookups: a key whose holders would bring it
// past that (a shared key's readers, a bulkhead's permits) begins the next
// page instead, unless it is the page's first key (then its holders, at
// most 1000, are looked up: a page always moves on). A key whose queue is
// longer than the names read ends its page too. An empty Next ends the
// listing; an outage is an error, as for Inspect; so are a negative Limit
// (wrapping tenace.ErrInvalidOption) and a closed provider
// (tenace.ErrProviderClosed), for List and Inspect alike.
func (p *Provider) List(ctx context.Context, opts tenace.ListOptions) (tenace.ListPage, error) {
	if ctx == nil {
		panic("tenace: etcdlock.Provider.List: nil ctx")
	}
	if opts.Limit < 0 {
		return tenace.ListPage{}, fmt.Errorf("%w: etcdlock: List: ListOptions.Limit is %d; give 0 for the default page, or a positive count", tenace.ErrInvalidOption, opts.Limit)
	}
	if p.closed.Err() != nil {
		return tenace.ListPage{}, errClosed
	}
	limit := opts.Limit
	if limit <= 0 || limit > 100 {
		limit = 100
	}
	start := p.prefix + escaper.Replace(opts.Prefix)
	end := clientv3.GetPrefixRangeEnd(start)
	from := start
	if opts.Cursor != "" {
		if !strings.HasPrefix(opts.Cursor, start) {
			return tenace.ListPage{}, fmt.Errorf("%w: etcdlock: List: the cursor %q is not one this provider returned for the prefix %s", tenace.ErrInvalidOption, opts.Cursor, keyfmt.Quote(opts.Prefix))
		}
		from = opts.Cursor
	}
	what := "listing the keys under " + keyfmt.Quote(opts.Prefix)
	if err := p.reachRead(ctx, what); err != nil {
		return tenace.ListPage{}, err
	}
	resp, err := p.client.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(10*limit)))
	if err != nil {
		return tenace.ListPage{}, readFailed(ctx, what, err)
	}
	var keys []string
	var page tenace.ListPage
	for _, kv := range resp.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), p.prefix)
		esc, _, ok := strings.Cut(rest, "/")
		if !ok {
			continue // not an entry of this provider's
		}
		key := unescaper.Replace(esc)
		if len(keys) > 0 && keys[len(keys)-1] == key {
			continue
		}
		if len(keys) == limit {
			page.Next = p.dir(key) // the next page begins with this key
			break
		}
		keys = append(keys, key)
	}
	if page.Next == "" && resp.More && len(keys) > 0 {
		page.Next = clientv3.GetPrefixRangeEnd(p.dir(keys[len(keys)-1])) // past the key whose queue the read cut short
	}
	if len(keys) == 0 {
		return page, nil
	}
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = p.queueOp(k)
	}
	tresp, err := p.client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return tenace.ListPage{}, readFailed(ctx, what, err)
	}
	now := time.Now()
	var queues [][]*mvccpb.KeyValue
	lookups := 0
	for i, r := range tresp.Responses {
		rr := r.GetResponseRange()
		info := p.readQueue(keys[i], rr.Kvs, rr.Count, now)
		if len(info.Holders) == 0 {
			continue
		}
		if len(page.Keys) > 0 && lookups+len(info.Holders) > maxLookups {
			page.Next = p.dir(keys[i]) // the next page begins with this key
			break
		}
		lookups += len(info.Holders)
		page.Keys, queues = append(page.Keys, info), append(queues, rr.Kvs)
	}
	if err := p.expiries(ctx, page.Keys, queues); err != nil {
		return tenace.ListPage{}, readFailed(ctx, what, err)
	}
	return page, nil
}
