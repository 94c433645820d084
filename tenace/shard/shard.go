package shard

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"tenace.dev/tenace/actor"
)

// ErrStopped is returned by a shard's methods once its group is stopped.
var ErrStopped = actor.ErrStopped

// Mode says what an acquire does when the key is held.
type Mode uint8

const (
	_ Mode = iota // the zero Mode is invalid
	// Wait queues behind the key's holder and waiters.
	Wait
	// Try fails at once instead of queueing.
	Try
)

// replyKind is what the shard tells a waiter. Every request that carries a
// waiter gets exactly one reply (invariant R below).
type replyKind uint8

const (
	replyInvalid   replyKind = iota
	replyGranted             // the waiter holds the key; token is the grant
	replyRefused             // a Try found the key held
	replyCancelled           // the waiter left the queue before its grant
	replyClosed              // the shard stopped while the waiter was queued
	replySynced              // a Sync barrier was reached

	// Not sent by the shard: what awaitOrGiveUp reports when the caller
	// gave up before its reply came.
	gaveUpCtx
	gaveUpTimeout
)

// reply is 16 bytes: a waiter's channel, the runtime's channel header
// (112 bytes on amd64) and a buffer of one, takes the 128-byte size class,
// as it would with an 8-byte reply. A grant's token and entry are in the Grant it
// points to, which the shard filled in before sending.
type reply struct {
	kind  replyKind
	grant *Grant // when kind is replyGranted
}

// waiter is the Table's waiter with its reply channel.
//
// The reply channel has a buffer of one, and every request gets exactly one
// reply (invariant R), so the shard's send never blocks, even when the caller
// has stopped listening. The channel is made once per waiter and never
// changes, and the shard never sends to it twice per request, so a waiter whose
// reply was received is empty again and can be pooled.
type waiter = Waiter[chan reply]

type msgKind uint8

const (
	msgInvalid     msgKind = iota
	msgAcquire             // key, w: queue w for key
	msgTry                 // key, w: grant w if key is free, else refuse
	msgRelease             // key, token: end grant token
	msgReleaseHeld         // held: end the grant held names (Grant.Release's fallback)
	msgCancel              // w: withdraw w (see Shard.withdraw)
	msgSync                // w: reply once every earlier message is applied
	msgReap                // nothing: wakes the shard, which sweeps after the batch if still due (see Grant.Release)
	msgQuery               // w: answer w's query (Inspect, List), then reply
)

// message is the one type on a shard's mailbox; kind says which fields count.
type message struct {
	kind    msgKind
	shared  bool  // msgAcquire, msgTry: the mode w asks for (see Waiter.SetShared)
	permits int32 // and its permit count
	key     string
	token   uint64
	w       *waiter
	held    *Held[chan reply]
}

// Outcome is the result of [Shard.Acquire] when it returns no error.
type Outcome struct {
	// Granted reports that the caller holds the key, as grant Token.
	Granted bool
	Token   uint64
	// PassedOn reports that the caller gave up (its context ended or its
	// timeout passed) at the moment the shard granted it: the withdrawal
	// passed the grant on, so the caller holds nothing. It is false when the
	// caller left the queue before any grant. For tests and statistics; both
	// leave the key as if the caller had never asked.
	PassedOn bool

	grant *Grant // when Granted
}

// Grant is what the caller keeps, when o is Granted, to release the key:
// the shard made it for this grant alone (see [Grant]). Nil when o is not
// Granted.
func (o Outcome) Grant() *Grant { return o.grant }

// Grant is a granted key, as its holder keeps it to release it. Its zero
// value holds nothing.
//
// The shard makes a Grant for each grant it sends, and never uses its
// memory for another: a second Release of it must still name the same
// grant. So the holder can hand out a *Grant as its lease, without a copy
// and without an allocation of its own. Grants are cut from slabs of
// grantSlab, which the shard allocates (one allocation every grantSlab
// grants instead of one per grant); a slab's memory is freed once none of
// its Grants is referenced, so a Grant kept long keeps its slab (512
// bytes) and the entries its neighbours still point to (about 4 KiB more
// at most; they can do nothing with them: tokens are never reused). A
// Grant holds nothing of its holder's: the shard keeps its current slab
// reachable, and whatever a Grant referenced would stay alive with it.
//
// A Grant is its Held alone: its entry and token. It finds its shard
// through the entry's table (see Table), not by a pointer of its own.
type Grant struct {
	held Held[chan reply]
}

// grantSlab is how many Grants the shard allocates at once: 16 bytes
// each, 512 bytes a slab, the largest object the runtime allocates
// without an 8-byte header of its type (a slab of 64 would take the
// 1,152-byte size class). The bytes are what the uncontended path pays
// the collector for: at a few hundred nanoseconds an operation, every
// byte a grant allocates brings the next collection closer, and while
// one marks, every pointer written on the path costs a write barrier.
// An allocation per grant costs about a sixth of an uncontended
// acquire+release (bench/README.md: the miniature, and Experiments,
// "Grant slabs"), about half of it the allocation's call, half the
// collector's work for the bytes; a Grant keeps no released flag and no
// shard pointer either, for the same reason: a second Release finds its
// grant no longer current instead.
const grantSlab = 32

// Token is the grant's token: strictly increasing per key, grant after
// grant.
func (g *Grant) Token() uint64 { return g.held.Token() }

// Release ends the grant; a second call changes nothing (it finds the
// grant no longer current: tokens are never reused). It never waits for
// the shard:
//
//   - When nobody waits for the key, it is one compare-and-swap on the
//     key's entry (see [Table], "Release by compare-and-swap"): the key is
//     free, and Size no longer counts it, when Release returns. The shard
//     deletes the free entries by a sweep when enough of them wait (a key
//     taken again before then keeps its entry), and at a Sync: when this
//     release makes the sweep due (see [Table.ReapDue]), it wakes the
//     shard with a reap message, without blocking (if the mailbox is full,
//     a batch comes next, and the shard checks after every batch).
//   - A shared grant's release is always a message (the shard counts its
//     shared holders); a second call finds the grant released.
//   - When someone waits, the CAS fails and the release is a message on the
//     shard's mailbox, which the shard applies by granting the oldest
//     waiter. The send blocks only while the mailbox is full.
//
// Either way, what the same goroutine sends to this shard afterwards (its
// next Acquire of the key, a Sync) is applied after the release: the CAS is
// visible to the shard's next read of the word, and the message is ahead in
// the FIFO mailbox. The release happens before the grant it lets through.
// After the group stopped, it does nothing. A second call costs what a
// release to waiters costs: its CAS fails, and the shard drops its message.
func (g *Grant) Release() {
	e := g.held.entry
	if e == nil {
		return
	}
	t := e.table
	if g.held.Shared() {
		// A shared grant is released by message only: the shard counts
		// its shared holders (see Table.ReleaseHeld).
		_ = t.shard.mb.Send(context.Background(), message{kind: msgReleaseHeld, held: &g.held})
		return
	}
	released, reap := t.ReleaseByCAS(&g.held)
	if !released {
		// Never gives up on a context: a release that was dropped would
		// leak the key. It blocks only while the mailbox is full. h stays
		// valid: a Grant is never reused (see above).
		_ = t.shard.mb.Send(context.Background(), message{kind: msgReleaseHeld, held: &g.held})
		return
	}
	if reap {
		t.shard.mb.TrySend(message{kind: msgReap})
	}
}

// Shard is one shard goroutine and the [Table] it alone owns.
//
// Concurrency: table, out, queued and grants are owned by the loop
// goroutine (the actor's handler); callers reach them only through mailbox
// messages, except for a release by CAS, which touches only the table's
// atomics (see [Grant.Release]). The published counts (waiting, longest
// and the shared ones) are written by the loop and read by anyone. No mutex
// guards anything here.
type Shard struct {
	group *Group
	mb    *actor.Actor[message]

	_             [64]byte // keep the published counts on a cache line of their own
	waiting       atomic.Int64
	longest       atomic.Int64
	sharedKeys    atomic.Int64 // see Table.SharedStats
	sharedHolders atomic.Int64
	sharedWaiting atomic.Int64
	_             [64]byte

	// waiters are this shard's idle waiters (see getWaiter).
	waiters sync.Pool

	// Owned by the loop goroutine, but for the table's atomics.
	table  *Table[chan reply]
	out    []delivery
	queued []string
	grants []Grant // what is left of the slab new Grants are cut from
}

type delivery struct {
	w *waiter
	r reply
}

func newShard(g *Group) *Shard {
	s := &Shard{group: g, table: NewTable[chan reply]()}
	s.table.shard = s
	s.mb = actor.Start(s.handle, actor.Options[message]{
		Mailbox: g.opts.Mailbox,
		OnStop:  s.stop,
		Go:      g.opts.Go,
	})
	return s
}

// handle applies one batch of messages to the table, tidies it (sweeps the
// keys freed by CAS when enough of them wait — a key freed and taken again
// in between keeps its entry: no map delete and insert per operation — and
// rebuilds the map after a burst), publishes the waiting counts, then
// delivers the replies. The table counts held keys as it grants, before
// any reply: a caller who has its reply sees a Size that includes its own
// effect. Tidying after the batch, not before, checks whatever the batch
// itself changed (see Table.ReleaseByCAS).
func (s *Shard) handle(batch []message) {
	// One clock reading per batch, not per grant: the grant and wait times
	// Inspect shows are the batch's.
	s.table.SetNow(s.group.now())
	for i := range batch {
		m := &batch[i]
		switch m.kind {
		case msgAcquire:
			m.w.SetShared(m.shared, int(m.permits))
			if s.table.Acquire(m.key, m.w) {
				s.grant(m.w)
			} else if s.group.opts.OnQueued != nil {
				s.queued = append(s.queued, m.key)
			}
		case msgTry:
			m.w.SetShared(m.shared, int(m.permits))
			if s.table.TryAcquire(m.key, m.w) {
				s.grant(m.w)
			} else {
				s.out = append(s.out, delivery{m.w, reply{kind: replyRefused}})
			}
		case msgRelease:
			_, next := s.table.Release(m.key, m.token)
			s.grantAll(next)
		case msgReleaseHeld:
			_, next := s.table.ReleaseHeld(m.held)
			s.grantAll(next)
		case msgCancel:
			removed, next := s.table.Cancel(m.w)
			if removed {
				s.out = append(s.out, delivery{m.w, reply{kind: replyCancelled}})
			}
			s.grantAll(next)
		case msgSync:
			// After a barrier, every key freed by CAS before it is gone
			// from the table.
			s.table.Reap()
			s.out = append(s.out, delivery{m.w, reply{kind: replySynced}})
		case msgReap:
			// Tidy, after the batch, sweeps if it is still due.
		case msgQuery:
			s.answer(m.w.query)
			s.out = append(s.out, delivery{m.w, reply{kind: replySynced}})
		default:
			panic("tenace: internal error: shard message of unknown kind")
		}
		if verify {
			if err := s.table.checkInvariants(false); err != nil {
				panic("tenace: internal error: lock table invariant broken: " + err.Error())
			}
		}
	}
	s.table.Tidy()
	s.publish()
	s.flush()
	for _, key := range s.queued {
		s.group.opts.OnQueued(key)
	}
	clear(s.queued)
	s.queued = s.queued[:0]
}

// grant makes w's Grant, cut from the current slab (see grantSlab), and
// queues its reply. A Grant made for a waiter that gave up as it was
// granted (abort during grant) is never handed out: the collector takes
// it with its slab.
func (s *Shard) grant(w *waiter) {
	if len(s.grants) == 0 {
		s.grants = make([]Grant, grantSlab)
	}
	g := &s.grants[0]
	s.grants = s.grants[1:]
	g.held = w.Held()
	s.out = append(s.out, delivery{w, reply{kind: replyGranted, grant: g}})
}

// grantAll grants next and the waiters granted with it (see Waiter.Also).
func (s *Shard) grantAll(next *waiter) {
	for ; next != nil; next = next.Also() {
		s.grant(next)
	}
}

// publish stores the counts for Stats; a store only when a count
// changed, so that a batch of exclusive grants without waiters writes
// nothing shared. The loads are of words only this goroutine writes.
func (s *Shard) publish() {
	keys, holders, waiting := s.table.SharedStats()
	publishCount(&s.waiting, s.table.Waiting())
	publishCount(&s.longest, s.table.Longest())
	publishCount(&s.sharedKeys, keys)
	publishCount(&s.sharedHolders, holders)
	publishCount(&s.sharedWaiting, waiting)
}

// publishCount sets a published count to n if it is not n already.
func publishCount(c *atomic.Int64, n int) {
	if c.Load() != int64(n) {
		c.Store(int64(n))
	}
}

func (s *Shard) flush() {
	for _, d := range s.out {
		select {
		case d.w.Value <- d.r:
		default:
			// Invariant R makes this unreachable; a silent block here would
			// hang every key of the shard, so fail loudly instead.
			panic("tenace: internal error: a waiter got two replies")
		}
	}
	clear(s.out)
	s.out = s.out[:0]
}

// stop runs on the loop goroutine when the group stops, after every message
// that was ahead of the stop request: every queued waiter is told the shard
// closed. Messages sent after the stop request are never applied; their
// senders got ErrStopped from Send.
func (s *Shard) stop() {
	for _, w := range s.table.Drain() {
		s.out = append(s.out, delivery{w, reply{kind: replyClosed}})
	}
	s.publish()
	s.flush()
}

// Acquire asks for key and waits for the outcome.
//
// It returns a granted Outcome when the key is the caller's; an Outcome that
// is not granted, and a nil error, when mode is Try and the key is held, or
// when timeout delivers first (a nil timeout never does; it also ends a
// wait for room in a full mailbox); ctx's error when ctx ends first;
// ErrStopped when the group is stopped. In every case but a grant the key
// is left as if the caller had never asked.
//
// Abort during grant. The caller gives up when ctx ends or timeout fires,
// and the shard may be granting it at that very moment: the grant can be in
// the reply channel unread, or about to be sent. Acquire does not try to find
// out which by looking — any look races with the shard. It sends a cancel
// message instead and waits for exactly one reply:
//
//   - The cancel is behind the acquire in the same mailbox, so the shard
//     applies it after the acquire, and sees the waiter either still queued
//     or already granted. Queued: the table removes it and the shard replies
//     "cancelled". Granted: the reply already sent was the grant, and the
//     table, finding the waiter still the holder, passes the grant on to the
//     next waiter (Table.Cancel) — the waiter never releases it, so nothing
//     leaks, and nobody runs under it.
//   - Release by CAS does not enter this race. Only the holder of a grant
//     may CAS its word to free, and a caller who gave up never holds a
//     grant: it never received a Grant to release. So when the cancel is
//     applied, the word still names the raced grant — held, or contended if
//     others queued since — and only the shard changes it: Cancel passes it
//     on exactly as a release message would.
//   - Either way exactly one reply is in (or on its way to) the channel, so
//     the one receive below cannot block forever and leaves the channel
//     empty for the waiter's next use.
//   - If the grant passes on, it is because the caller gave up; Acquire then
//     reports the caller's reason (ctx's error, or not granted), so a caller
//     who sees an error never holds the key.
//
// The waiter is pooled once its one reply is received, while the cancel may
// still be queued; that is safe because waiters are pooled per shard (see
// getWaiter), so every later use of the waiter is a message sent to the
// same mailbox after the cancel, which it delivers after it.
func (s *Shard) Acquire(ctx context.Context, key string, mode Mode, timeout <-chan time.Time) (Outcome, error) {
	return s.acquire(ctx, key, nil, mode, timeout)
}

// AcquireShared is Acquire of one of key's permits: shared with other
// shared holders, up to permits of them (0: no limit), and never beside an
// exclusive holder; see [Table], "Shared holders", for the order of grants
// and the key's permit count. permits must be at least 0 and fit in an
// int32; it panics otherwise (the caller validates). Its Grant is released
// by message.
func (s *Shard) AcquireShared(ctx context.Context, key string, permits int, mode Mode, timeout <-chan time.Time) (Outcome, error) {
	if permits < 0 || permits > math.MaxInt32 {
		panic("tenace: shard.AcquireShared: permits out of range")
	}
	return s.acquire(ctx, key, &Request{Shared: true, Permits: permits}, mode, timeout)
}

// AcquireWith is Acquire, or AcquireShared when r.Shared, with the
// caller's label r.Label; when it returns an Outcome not granted because
// a Try was refused or the timeout passed while the request was queued,
// it reports in r the key's holder the shard found then (r.Holder), with
// no message more than the withdrawal's. r.Permits is checked as
// AcquireShared checks it.
func (s *Shard) AcquireWith(ctx context.Context, key string, r *Request, mode Mode, timeout <-chan time.Time) (Outcome, error) {
	if r.Permits < 0 || r.Permits > math.MaxInt32 {
		panic("tenace: shard.AcquireWith: permits out of range")
	}
	r.Holder, r.HolderSeen = HolderView{}, false
	return s.acquire(ctx, key, r, mode, timeout)
}

// acquire is Acquire with r's mode and label (nil: exclusive, no label),
// and r's Holder to report.
func (s *Shard) acquire(ctx context.Context, key string, r *Request, mode Mode, timeout <-chan time.Time) (Outcome, error) {
	kind := msgAcquire
	switch mode {
	case Wait:
	case Try:
		kind = msgTry
	default:
		panic("tenace: shard.Acquire: invalid mode")
	}
	w := s.getWaiter()
	// The mode travels in the message, and the shard sets it on w: a pooled
	// waiter may still have a cancel of its last request ahead in the
	// mailbox (see withdraw), which reads w's mode of then. The label does
	// not need to: no cancel reads it (a stale cancel finds its waiter
	// Granted), so the caller sets it here, before the send.
	m := message{kind: kind, key: key, w: w}
	if r != nil {
		m.shared, m.permits = r.Shared, int32(r.Permits)
		w.SetLabel(r.Label)
	} else {
		w.SetLabel("")
	}
	// The timeout bounds the wait for room in a full mailbox too.
	if err := s.mb.SendWithin(ctx, m, timeout); err != nil {
		if err != ErrStopped {
			s.putWaiter(w) // never sent: nothing will reply
		} // else the shard may still reply to it: drop it
		if err == actor.ErrFull {
			return Outcome{}, nil // not granted within the timeout
		}
		return Outcome{}, err
	}
	// Send returned nil, so the shard handles the acquire before it stops,
	// and exactly one reply comes: the grant, the refusal, or "closed" from
	// the stop's drain of the table. No need to watch for the stop here.
	var rep reply
	if done := ctx.Done(); done == nil && timeout == nil {
		rep = <-w.Value // a plain receive is much cheaper than a select
	} else {
		switch rep = awaitOrGiveUp(w, done, timeout); rep.kind {
		case gaveUpCtx:
			return Outcome{PassedOn: s.withdraw(w, nil)}, ctx.Err()
		case gaveUpTimeout:
			return Outcome{PassedOn: s.withdraw(w, r)}, nil
		}
	}
	// The shard filled in rep.grant (or w's Seen) before it sent the
	// reply, and the receive happens after the send: reading it is ordered.
	if rep.kind == replyRefused && r != nil {
		r.see(w)
	}
	s.putWaiter(w)
	switch rep.kind {
	case replyGranted:
		return Outcome{Granted: true, Token: rep.grant.Token(), grant: rep.grant}, nil
	case replyRefused:
		return Outcome{}, nil
	}
	return Outcome{}, ErrStopped // replyClosed
}

// awaitOrGiveUp waits for w's reply, or for done or timeout, whichever
// comes first; giving up is reported as a reply of kind gaveUpCtx or
// gaveUpTimeout. It is its own function so that the select's frame is on
// the stack only of waiters that can give up: every parked waiter keeps
// Acquire's frame, and a 2 KiB stack has little room (see bench/README.md,
// Waiters).
//
//go:noinline
func awaitOrGiveUp(w *waiter, done <-chan struct{}, timeout <-chan time.Time) reply {
	select {
	case r := <-w.Value:
		return r
	case <-done:
		return reply{kind: gaveUpCtx}
	case <-timeout:
		return reply{kind: gaveUpTimeout}
	}
}

// withdraw cancels w after its caller gave up, and reports whether the
// grant raced the give-up and was passed on; see the abort-during-grant note
// on Acquire.
// When the withdrawal took w from the queue and r is not nil, it reports
// in r the holder the shard found then.
func (s *Shard) withdraw(w *waiter, r *Request) (passedOn bool) {
	// No ctx: the caller's has ended, and the cancel must get through. It
	// blocks only while the mailbox is full, which the loop is draining. If
	// the shard is stopping the cancel may go unhandled, but the acquire was
	// handled, so its one reply still comes (the grant, or "closed").
	_ = s.mb.Send(context.Background(), message{kind: msgCancel, w: w})
	rep := <-w.Value
	if rep.kind == replyCancelled && r != nil {
		r.see(w)
	}
	s.putWaiter(w)
	return rep.kind == replyGranted
}

// Release ends grant token on key by a message: the fallback of
// [Grant.Release], which a holder should use instead. It returns once the
// release is in the mailbox, usually before the shard has applied it; anything the same
// goroutine sends to this shard afterwards (its next Acquire of the key, a
// Sync) is applied after it, because the mailbox is FIFO. The release
// happens before the grant it lets through: the shard applies it, then sends
// the next waiter its grant, and that send happens before the waiter's
// receive. A stale token does nothing, nor does a shared grant's (release
// those with Grant.Release). After Stop it does nothing.
func (s *Shard) Release(key string, token uint64) {
	// Never gives up on a context: a release that was dropped would leak the
	// key. It blocks only while the mailbox is full.
	_ = s.mb.Send(context.Background(), message{kind: msgRelease, key: key, token: token})
}

// Sync returns once the shard has applied every message sent to it before
// the call (by any goroutine whose send happened before), or ctx's error, or
// ErrStopped.
func (s *Shard) Sync(ctx context.Context) error {
	w := s.getWaiter()
	if err := s.mb.Send(ctx, message{kind: msgSync, w: w}); err != nil {
		return err
	}
	<-w.Value // handled before any stop: its reply comes
	s.putWaiter(w)
	return nil
}

// Size is the number of keys this shard holds or has waiters for: exact as
// soon as a release by CAS returns; a grant, and a release or cancel by
// message, counts as the shard applies it, before the replies of its batch.
func (s *Shard) Size() int { return s.table.Len() }

// Waiting is the number of callers queued on this shard's keys, and Longest
// the most queued for one key, as of the last batch applied.
func (s *Shard) Waiting() (waiting, longest int) {
	return int(s.waiting.Load()), int(s.longest.Load())
}

// SharedStats is [Table.SharedStats] as of the last batch applied: the
// keys held shared, their shared holders (the permits in use), and the
// callers queued for a shared grant. Each is one atomic load, read on its
// own: while grants change hands they may come from different batches,
// and from another moment than Size.
func (s *Shard) SharedStats() (keys, holders, waiting int) {
	return int(s.sharedKeys.Load()), int(s.sharedHolders.Load()), int(s.sharedWaiting.Load())
}

// getWaiter returns an idle waiter of this shard. Waiters are pooled per
// shard: a waiter is pooled once its one reply is received, while its
// cancel may still be on this shard's mailbox (see withdraw), and only a
// later message to the same mailbox is ordered after that cancel. Pooled
// per group, a waiter could be reused on another shard and the stale
// cancel applied to it there, by the wrong shard. Per shard, not per
// process, also keeps a group made inside a testing/synctest bubble from
// receiving a channel made in another bubble. A pooled waiter's channel is
// always empty (every path that pools one has received its one reply).
func (s *Shard) getWaiter() *waiter {
	if w, ok := s.waiters.Get().(*waiter); ok {
		return w
	}
	// Buffer of one: the shard's reply never blocks (see waiter).
	return &waiter{Value: make(chan reply, 1)}
}

func (s *Shard) putWaiter(w *waiter) { s.waiters.Put(w) }
