package shard

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
)

// State is where a [Waiter] stands in a [Table]. The zero value is invalid,
// so a waiter that was never handed to a table is recognisable.
type State uint8

const (
	_ State = iota // the zero State is invalid: never handed to a table
	// Queued: the waiter is in its key's FIFO queue.
	Queued
	// Granted: the waiter was granted; the table no longer refers to it.
	Granted
	// Refused: a TryAcquire found the key held; the waiter never queued.
	Refused
	// Cancelled: the waiter left the queue before its grant.
	Cancelled
)

// String is the state's name.
func (s State) String() string {
	switch s {
	case Queued:
		return "queued"
	case Granted:
		return "granted"
	case Refused:
		return "refused"
	case Cancelled:
		return "cancelled"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Waiter is one acquire request. The caller owns Value and may read Token,
// State and Held once the table has reported the waiter's outcome; the table
// owns every other field from the call that hands it the waiter until that
// outcome.
//
// A waiter may be reused for a later request once its outcome was reported,
// with one exception: a Granted waiter that may still be passed to
// [Table.Cancel] (the abort-during-grant case) must not be reused before that
// call, because Cancel reads its token and entry.
type Waiter[T any] struct {
	// Value is the caller's data (the shard goroutine keeps the reply
	// channel here). The table never reads or writes it.
	Value T

	token      uint64
	lock       *entry[T] // the key's entry, once queued or granted
	prev, next *Waiter[T]
	state      State
}

// Token is the grant token the table gave the waiter when it arrived.
func (w *Waiter[T]) Token() uint64 { return w.token }

// State is where the waiter stands.
func (w *Waiter[T]) State() State { return w.state }

// Held is what the holder of a grant keeps to release it: see
// [Table.ReleaseByCAS]. Its zero value holds nothing.
type Held[T any] struct {
	lock  *entry[T]
	token uint64
	// The reclaim list's link: written once by the releasing goroutine just
	// after it pushed the Held, read by the owner only once link says it is
	// there (see Table.ReleaseByCAS).
	next *Held[T]
	link uint32 // linkPending, linkSet or linkAwaited; atomic
	// Set by the first Grant.Release (atomic), so that a second does
	// nothing; here rather than in Grant, where it would not fit in the
	// padding after link.
	released uint32
}

// A pushed Held's link state. Each side moves it once, by one
// compare-and-swap from linkPending (never looped on): the releaser to
// linkSet once next is written; the owner to linkAwaited when it pops the
// Held before that, and then waits for the releaser's reap request instead
// of for the releaser.
const (
	linkPending uint32 = iota // pushed; next not written yet
	linkSet                   // next written: the owner may follow it
	linkAwaited               // the owner popped it first and keeps it until next is written
)

// Held returns the grant w holds, for its holder to release; valid once w is
// Granted.
func (w *Waiter[T]) Held() Held[T] { return Held[T]{lock: w.lock, token: w.token} }

// Token is the grant's token.
func (h *Held[T]) Token() uint64 { return h.token }

// An entry's state word, the one field of the table that goroutines other
// than the owner touch (see Table, "Release by compare-and-swap"):
//
//	stFree          0          nobody holds the key; only the owner moves an entry out of free
//	stDead          1          the entry left the table (reaped, drained, or spare)
//	held(t)         t<<1       grant t holds the key and nobody waits: its holder may CAS it to free
//	contended(t)    t<<1 | 1   grant t holds the key and waiters may queue: only a message frees it
//
// Tokens start at 1, so no held or contended word equals stFree or stDead.
const (
	stFree uint64 = 0
	stDead uint64 = 1
)

func held(token uint64) uint64      { return token << 1 }
func contended(token uint64) uint64 { return token<<1 | 1 }
func tokenOfWord(s uint64) uint64   { return s >> 1 }
func isContended(s uint64) bool     { return s&1 == 1 && s != stDead }

// entry is one key's lock: its state word and its FIFO queue of waiters.
// Everything but state is owned by the table's owner.
type entry[T any] struct {
	state      atomic.Uint64
	key        string
	head, tail *Waiter[T] // FIFO queue, oldest first
	waiting    int
}

// Table is one shard's lock table: a deterministic state machine. It has no
// goroutines, channels, clock or randomness: requests go in as method calls,
// and the effects (which waiter is granted now) come out as return values
// for the caller to deliver.
//
// Concurrency: a Table has one owner, the goroutine that calls its methods
// (in the lock manager, the shard goroutine); no mutex guards it because
// nothing else can reach it. The one exception is [Table.ReleaseByCAS],
// which the holder of a grant calls from its own goroutine: it touches only
// atomics — the key's state word, the table's reclaim list and its
// counts — and never the map or the queues. Every other method is the
// owner's.
//
// Tokens: every request gets the next value of a table-wide counter when it
// arrives (1, 2, 3, …). Because each key grants in arrival order, the tokens a
// key grants strictly increase, grant after grant: they are fencing tokens,
// and they tell a current grant from a stale one, so a release or cancel that
// names an earlier grant does nothing.
//
// # Release by compare-and-swap
//
// Each entry has an atomic state word: free, held(t), or contended(t) (t is
// the grant's token). Only the owner moves an entry out of free (a grant),
// and only the owner sets the contended bit, in the same step in which it
// queues the first waiter. The holder of grant t releases with one
// compare-and-swap held(t) → free; when that fails — the word is
// contended(t): someone waits — it sends the release as a message instead,
// and the owner hands the key on in FIFO order. The swap is tried once and
// never looped on: it is not a lock, and the owner alone still decides who
// is granted. The owner never waits on a releaser and a releaser never waits
// on the owner.
//
// Why a CAS cannot overtake a waiter: the CAS succeeds only on a word
// without the contended bit, and the owner sets the bit before it queues
// anyone. If the owner's own CAS held(t) → contended(t) fails, the holder
// has just freed the key, and the owner grants the arriving waiter at once,
// as if its acquire had come after the release — which it did, in the order
// of the word's modifications.
//
// Reclaim: a key freed by CAS is no longer held (Len drops at once) but its
// entry is still in the map. The releaser pushes its [Held] on the table's
// reclaim list — one swap of the list's head, then the link, with no loop
// and no wait on either side (see [Table.ReleaseByCAS]); [Table.Reap], run
// by the owner, pops the whole list and deletes each entry still free (it
// stays free while the owner looks: only the owner moves it out of free).
// The owner recycles the entry, so that a busy table does not allocate one
// per key.
//
// Happens-before: a release by CAS is an atomic write that the owner's next
// read of the word observes before it grants the key again, and the grant
// then travels to the next holder on a channel: what the releaser wrote
// before Release is visible to the next holder. A released-by-message grant
// is ordered by the mailbox, as before.
//
// Invariants (checked by [Table.CheckInvariants]):
//  1. Every entry in the map is under its own key and its word is free,
//     held(t) or contended(t), never dead. A key is held iff its entry's
//     word is held or contended; Len counts them. A free entry has no
//     waiters: it is waiting only for Reap. An idle table that Reap got
//     through (nothing awaits its link) is empty.
//  2. At most one holder per key (the word names one token).
//  3. A key with waiters is contended (so its holder cannot free it by CAS);
//     tokens strictly increase along holder, queue head, …, queue tail, and
//     every token is at most the last one handed out.
//  4. Every queued waiter has state Queued and the entry of the queue it is
//     in; the queue's links and counts agree.
//
// Fairness: a key is granted in arrival order — the order in which the table
// receives the requests, which for the shard goroutine is the order the
// acquire messages reach its mailbox, not the order callers called Acquire.
// A release by CAS happens only when nobody waits, so it changes no one's
// turn. The exceptions, each deliberate:
//   - a TryAcquire never queues: it succeeds only on a free key, and a key
//     with waiters is never free (invariant 3), so a try cannot overtake a
//     waiter, it can only fail;
//   - a waiter that cancels leaves the queue and loses its place; the ones
//     behind it move up;
//   - a waiter cancelled after its grant (abort during grant) does not keep
//     the lock: its grant passes at once to the next waiter in line, which is
//     what that waiter would have got had the cancel come first.
type Table[T any] struct {
	// Touched by releasers too (atomics only).
	freed  atomic.Pointer[Held[T]] // reclaim list: grants released by CAS, newest first
	_      [56]byte                // keep the list's head off the counts' line
	held   atomic.Int64            // keys held: words held or contended
	pushes atomic.Uint64           // grants pushed on the reclaim list, ever

	// Owned by the table's owner.
	awaited []*Held[T] // popped before their releaser linked them (see linkAwaited)
	reaped  uint64     // pushes counted when Reap last popped the list

	entries map[string]*entry[T]
	peak    int         // most entries since the map was last rebuilt
	spare   []*entry[T] // recycled entries, all dead
	last    uint64      // last token handed out
	waiting int         // waiters queued over all keys
	byLen   []int       // byLen[n]: keys with exactly n waiters (n ≥ 1)
	longest int         // the longest queue: the largest n with byLen[n] > 0
}

// NewTable returns an empty table.
func NewTable[T any]() *Table[T] {
	return &Table[T]{entries: make(map[string]*entry[T])}
}

// reapDepth: every reapDepth-th push on the reclaim list asks the owner to
// reap (ReleaseByCAS reports it), and the owner reaps on its own when it
// finds that many pushes since its last reap (ReapDue), so that a burst of
// releases with no other traffic does not leave its entries in the map:
// once every release has returned and the owner has handled its
// messages, fewer than reapDepth freed entries per table remain.
const reapDepth = 64

// spareMax bounds the recycled entries a table keeps: enough for the keys a
// busy shard frees between two batches, little memory when idle.
const spareMax = 256

// shrinkMin and shrinkRatio: the owner rebuilds the map once it holds fewer
// than 1/shrinkRatio of the most entries it held since the last rebuild, and
// that peak was at least shrinkMin. Go maps never shrink, so a burst of a
// million keys would otherwise keep its buckets for the table's life; the
// copy costs at most peak/shrinkRatio moves per rebuild, paid once per
// shrinkRatio-fold drop, which a steady state never triggers.
const (
	shrinkMin   = 1024
	shrinkRatio = 8
)

func (t *Table[T]) arrive(w *Waiter[T]) {
	t.last++
	w.token, w.lock, w.prev, w.next = t.last, nil, nil, nil
}

// Acquire hands w to the table for key. If key is free, w is granted at once
// and Acquire reports true; otherwise w is queued behind the key's waiters
// and will be returned, when its turn comes, by the Release or Cancel that
// frees the key.
func (t *Table[T]) Acquire(key string, w *Waiter[T]) (granted bool) {
	t.arrive(w)
	e := t.entries[key]
	if e == nil {
		t.grantNew(key, w)
		return true
	}
	s := e.state.Load()
	if s == stFree {
		t.grantFree(e, w)
		return true
	}
	if e.head == nil && !isContended(s) && !e.state.CompareAndSwap(s, contended(tokenOfWord(s))) {
		// The holder freed the key by CAS since the Load: grant w, as
		// the release came first in the word's order.
		t.grantFree(e, w)
		return true
	}
	// The word is contended now: the holder's CAS fails from here on, and
	// its release comes as a message.
	w.state, w.lock = Queued, e
	if e.tail == nil {
		e.head = w
	} else {
		e.tail.next, w.prev = w, e.tail
	}
	e.tail = w
	t.queueGrew(e)
	return false
}

// TryAcquire grants w if key is free and refuses it otherwise; w never queues.
func (t *Table[T]) TryAcquire(key string, w *Waiter[T]) (granted bool) {
	t.arrive(w)
	e := t.entries[key]
	if e == nil {
		t.grantNew(key, w)
		return true
	}
	if s := e.state.Load(); s == stFree || !refusesHeld() {
		t.grantFree(e, w)
		return true
	}
	w.state = Refused
	return false
}

// grantNew makes key's entry and grants it to w.
func (t *Table[T]) grantNew(key string, w *Waiter[T]) {
	var e *entry[T]
	if n := len(t.spare); n > 0 {
		e, t.spare[n-1] = t.spare[n-1], nil
		t.spare = t.spare[:n-1]
	} else {
		e = new(entry[T])
	}
	e.key = key
	t.entries[key] = e
	t.peak = max(t.peak, len(t.entries))
	t.grantFree(e, w)
}

// grantFree grants free entry e to w. A plain store is enough: only the
// owner moves a word out of free, and no releaser's CAS matches free.
func (t *Table[T]) grantFree(e *entry[T], w *Waiter[T]) {
	e.state.Store(held(w.token))
	t.held.Add(1)
	w.state, w.lock = Granted, e
}

// ReleaseByCAS is the holder's release of h, from any goroutine, at most
// once per grant: one compare-and-swap held(token) → free. It reports true
// when that freed the key; then h is on the reclaim list, and reap reports
// that the owner should be woken to reap (every reapDepth-th push, or when
// the owner awaits h's link). It reports false when the key has waiters (or
// the grant is stale, or the table was drained): the caller must send the
// release to the owner, who calls [Table.ReleaseHeld] with h.
//
// The push has no loop either: one swap makes h the list's head, then h is
// linked to what it displaced, and one compare-and-swap of h's link state
// says so. The owner may pop h between the two (it takes the whole list
// with a swap); it then reaps h's entry, finds the link missing, marks h
// awaited and keeps it, and this call, finding h awaited, asks for a reap:
// at the owner's next reap the rest of the list is reachable again.
// Neither side ever waits for the other. A grant is pushed once, so the
// list has no ABA problem.
func (t *Table[T]) ReleaseByCAS(h *Held[T]) (released, reap bool) {
	if h.lock == nil || !h.lock.state.CompareAndSwap(releaseWord(h.lock, h.token), stFree) {
		return false, false
	}
	t.held.Add(-1)
	below := t.freed.Swap(h)
	if verify {
		// The verify build widens the gap between the swap and the link,
		// so that its tests meet an owner that pops h before it is linked.
		runtime.Gosched()
	}
	return true, t.link(h, below)
}

// link is the second half of h's push on the reclaim list, after the swap
// that made h its head and returned below: it links h to below and says so,
// and reports whether the owner should be woken to reap.
func (t *Table[T]) link(h, below *Held[T]) (reap bool) {
	h.next = below
	reap = t.pushes.Add(1)%reapDepth == 0
	if !atomic.CompareAndSwapUint32(&h.link, linkPending, linkSet) {
		// The owner popped h before the link was written, and keeps it
		// until it is: publish the link, and wake the owner to follow it.
		atomic.StoreUint32(&h.link, linkSet)
		reap = true
	}
	return reap
}

// Reap deletes the entries of keys freed by CAS whose Held it can reach:
// every one pushed before the call, except those below a Held whose
// releaser has not linked it yet (kept awaited; ReapDue stays true until a
// Reap gets past it). It also rebuilds the map when it has shrunk far below
// its peak (see shrinkMin). The shard goroutine calls it through Tidy, when
// a releaser asks, and before a Sync barrier; it costs one atomic load when
// nothing was freed.
func (t *Table[T]) Reap() {
	// Read before the pop: a push is counted after its swap, so every push
	// counted here is in the list popped below, in an earlier one, or below
	// an awaited Held. Rounded down to a multiple of reapDepth: the pushes
	// that ask for a reap are the multiples, so a batch that follows a
	// request dropped on a full mailbox finds the reap due.
	p := t.pushes.Load()
	t.reaped = p - p%reapDepth
	if len(t.awaited) > 0 {
		t.reapAwaited()
	}
	if t.freed.Load() != nil {
		t.reapList(t.freed.Swap(nil))
	}
	t.shrink()
}

// Tidy is the owner's housekeeping before each batch: Reap when it is due,
// else only the rebuild of a map that a burst released by message has left
// far below its peak. It costs one atomic load and a few comparisons when
// there is nothing to do.
func (t *Table[T]) Tidy() {
	if t.ReapDue() {
		t.Reap()
	} else if t.peak >= shrinkMin || cap(t.byLen) > shrinkMin {
		t.shrink()
	}
}

// ReapDue reports whether the owner should reap now: a multiple of
// reapDepth releases by CAS was crossed since the last Reap (the push that
// crossed it also asked for a reap, which a full mailbox may have
// dropped), or a Held still awaits its link. An owner that reaps only then
// (and when a releaser or a barrier asks) lets a key freed and taken again
// between two reaps keep its entry; once every release has returned and
// the owner has handled its messages, fewer than reapDepth freed entries
// wait in the map. It costs one atomic load.
func (t *Table[T]) ReapDue() bool {
	return len(t.awaited) > 0 || t.pushes.Load()-t.reaped >= reapDepth
}

// shrink rebuilds the map, and the queue-length counts, when they have
// shrunk far below their peak (see shrinkMin).
func (t *Table[T]) shrink() {
	if t.peak >= shrinkMin && len(t.entries) <= t.peak/shrinkRatio {
		t.entries = maps_clone(t.entries)
		t.peak = len(t.entries)
	}
	if cap(t.byLen) > shrinkMin && t.longest < cap(t.byLen)/shrinkRatio {
		t.byLen = slices.Clone(t.byLen[:t.longest+1])
	}
}

// reapList deletes the entries of the grants on a list popped from the
// reclaim list, as far as its links are written (see ReleaseByCAS).
func (t *Table[T]) reapList(h *Held[T]) {
	for h != nil {
		// A free word stays free while the owner looks: only the owner
		// moves it out of free. A word that is held again, or dead (the
		// entry was reaped through an earlier grant of the same key), is
		// left alone.
		if e := h.lock; reclaimable(e) {
			delete(t.entries, e.key)
			t.recycle(e)
		}
		if atomic.LoadUint32(&h.link) != linkSet && atomic.CompareAndSwapUint32(&h.link, linkPending, linkAwaited) {
			// Its releaser has not linked it yet: keep it, and go on
			// from it when its releaser's reap request comes.
			t.awaited = append(t.awaited, h)
			return
		}
		next := h.next
		h.next = nil // let a kept lease not hold older ones
		h = next
	}
}

// reapAwaited goes on along the lists whose links were missing at an
// earlier Reap and are written now; the others stay awaited.
func (t *Table[T]) reapAwaited() {
	awaited := t.awaited
	t.awaited = nil
	for i, h := range awaited {
		awaited[i] = nil
		if atomic.LoadUint32(&h.link) != linkSet {
			t.awaited = append(t.awaited, h)
			continue
		}
		next := h.next
		h.next = nil
		t.reapList(next)
	}
}

// maps_clone copies m into a map sized for it (maps.Clone keeps m's
// capacity, which is what we want to drop).
func maps_clone[K comparable, V any](m map[K]V) map[K]V {
	c := make(map[K]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// recycle keeps e, out of the map and dead, for a later key.
func (t *Table[T]) recycle(e *entry[T]) {
	e.state.Store(stDead)
	e.key, e.head, e.tail, e.waiting = "", nil, nil, 0
	if len(t.spare) < spareMax {
		t.spare = append(t.spare, e)
	}
}

// ReleaseHeld is [Table.Release] of the grant h: the message a holder
// sends when its CAS found waiters. It needs no map lookup: h names the
// entry, and the entry's word says whether h is still its grant.
func (t *Table[T]) ReleaseHeld(h *Held[T]) (released bool, next *Waiter[T]) {
	if h.lock == nil {
		return false, nil
	}
	s := h.lock.state.Load()
	if !isCurrent(s, h.token) {
		return false, nil
	}
	return true, t.handOn(h.lock, s)
}

// Release ends the grant token on key: the message path, for a holder whose
// CAS found waiters. If token is the current grant, the key passes to its
// oldest waiter, returned as next (nil when nobody waits, and the key's
// entry is removed). A stale or unknown token changes nothing and reports
// released false.
func (t *Table[T]) Release(key string, token uint64) (released bool, next *Waiter[T]) {
	e := t.entries[key]
	if e == nil {
		return false, nil
	}
	s := e.state.Load()
	if !isCurrent(s, token) {
		return false, nil
	}
	return true, t.handOn(e, s)
}

// handOn gives e, whose holder (word s) is done, to its oldest waiter.
func (t *Table[T]) handOn(e *entry[T], s uint64) *Waiter[T] {
	w := nextHolder(e)
	if w == nil {
		// Nobody waits. A held (not contended) word's holder may free it by
		// CAS at this moment only if it is releasing twice; if it did, the
		// key is free and Reap deletes it.
		if e.state.CompareAndSwap(s, stDead) {
			t.held.Add(-1)
			delete(t.entries, e.key)
			t.recycle(e)
		}
		return nil
	}
	t.unlink(e, w)
	// A plain store: the word is contended (e had waiters), and nobody but
	// the owner writes a contended word. The new holder may use CAS when
	// nobody waits behind it.
	if e.head == nil {
		e.state.Store(held(w.token))
	} else {
		e.state.Store(contended(w.token))
	}
	w.state, w.lock = Granted, e
	return w
}

// queueGrew and queueShrank keep the waiting counts and the longest queue.
func (t *Table[T]) queueGrew(e *entry[T]) {
	if e.waiting > 0 {
		t.byLen[e.waiting]--
	}
	e.waiting++
	t.waiting++
	for len(t.byLen) <= e.waiting {
		t.byLen = append(t.byLen, 0)
	}
	t.byLen[e.waiting]++
	t.longest = max(t.longest, e.waiting)
}

func (t *Table[T]) queueShrank(e *entry[T]) {
	t.byLen[e.waiting]--
	if e.waiting == t.longest && t.byLen[e.waiting] == 0 {
		t.longest-- // e is now the longest, at one less
	}
	e.waiting--
	t.waiting--
	if e.waiting > 0 {
		t.byLen[e.waiting]++
	}
}

// unlink removes w from e's queue.
func (t *Table[T]) unlink(e *entry[T], w *Waiter[T]) {
	if w.prev == nil {
		e.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		e.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	t.queueShrank(e)
	w.prev, w.next = nil, nil
}

// Cancel withdraws w, whose caller gave up (its context ended or its timeout
// passed). What happens depends on how far w got:
//   - Queued: w leaves the queue; removed is true, and w is now Cancelled.
//     If it was the last waiter, the key is held but no longer contended,
//     so its holder can release by CAS again.
//   - Granted and still the key's holder (the grant landed while the caller
//     was giving up): the grant passes on as if released; next is the waiter
//     granted now, if any. This is how an abort during grant never leaks.
//     The caller never released that grant (it never had a lease), so the
//     word still names it.
//   - otherwise (refused, already cancelled, or its grant already released):
//     nothing changes.
func (t *Table[T]) Cancel(w *Waiter[T]) (removed bool, next *Waiter[T]) {
	switch w.state {
	case Queued:
		w.state = Cancelled
		if !leavesQueue() {
			return true, nil
		}
		e := w.lock
		t.unlink(e, w)
		if e.head == nil {
			// A plain store: nobody but the owner writes a contended word.
			e.state.Store(held(tokenOfWord(e.state.Load())))
		}
		return true, nil
	case Granted:
		if e := w.lock; e != nil && passesOnRacedGrant() {
			if s := e.state.Load(); isCurrent(s, w.token) {
				return false, t.handOn(e, s)
			}
		}
	}
	return false, nil
}

// Len is the number of keys held or waited for (a key with waiters is
// held). It is exact at once after a release by CAS, and safe to call from
// any goroutine.
func (t *Table[T]) Len() int { return int(t.held.Load()) }

// Entries is the number of entries in the map: the keys held, plus keys
// freed by CAS that Reap has not deleted yet.
func (t *Table[T]) Entries() int { return len(t.entries) }

// Waiting is the number of waiters queued over all keys.
func (t *Table[T]) Waiting() int { return t.waiting }

// Longest is the number of waiters of the key with the most.
func (t *Table[T]) Longest() int { return t.longest }

// Holder returns the token of key's current grant.
func (t *Table[T]) Holder(key string) (token uint64, held bool) {
	e := t.entries[key]
	if e == nil {
		return 0, false
	}
	s := e.state.Load()
	if s == stFree {
		return 0, false
	}
	return tokenOfWord(s), true
}

// Queue returns the tokens of key's waiters, oldest first.
func (t *Table[T]) Queue(key string) []uint64 {
	e := t.entries[key]
	if e == nil {
		return nil
	}
	var q []uint64
	for w := e.head; w != nil; w = w.next {
		q = append(q, w.token)
	}
	return q
}

// Drain empties the table and returns every queued waiter, oldest first per
// key, each now Cancelled. Every entry's word becomes dead, so a later
// release by CAS fails (and its message finds nobody to apply it). The
// shard goroutine calls it when it stops, to fail whoever still waits.
func (t *Table[T]) Drain() []*Waiter[T] {
	var out []*Waiter[T]
	for key, e := range t.entries {
		for w := e.head; w != nil; {
			next := w.next
			w.state, w.prev, w.next = Cancelled, nil, nil
			out = append(out, w)
			w = next
		}
		// Swap, not Store: whichever of this and a holder's CAS comes
		// first decrements the held count, exactly once.
		if old := e.state.Swap(stDead); old != stFree && old != stDead {
			t.held.Add(-1)
		}
		delete(t.entries, key)
	}
	t.freed.Store(nil)
	t.awaited = nil
	t.entries, t.spare, t.byLen = make(map[string]*entry[T]), nil, nil
	t.peak, t.waiting, t.longest = 0, 0, 0
	return out
}

// CheckInvariants returns an error describing the first broken invariants of
// the Table type's doc, or nil. It walks the whole table: call it in tests,
// with no release by CAS running at the same time (see checkInvariants).
func (t *Table[T]) CheckInvariants() error { return t.checkInvariants(true) }

// checkInvariants is CheckInvariants; with quiescent false it skips what a
// concurrent release by CAS may change mid-walk (a held word becoming free,
// the held count), for the shard's verify build.
func (t *Table[T]) checkInvariants(quiescent bool) error {
	var errs []error
	waiting, heldKeys, longest := 0, 0, 0
	byLen := make([]int, len(t.byLen))
	for key, e := range t.entries {
		s := e.state.Load()
		if e.key != key {
			errs = append(errs, fmt.Errorf("invariant 1: key %q has the entry of %q", key, e.key))
		}
		if s == stDead {
			errs = append(errs, fmt.Errorf("invariant 1: key %q has a dead entry", key))
			continue
		}
		if s != stFree {
			heldKeys++
		}
		if s == stFree && e.head != nil {
			errs = append(errs, fmt.Errorf("invariant 3: key %q is free with waiters", key))
		}
		if e.head != nil && !isContended(s) {
			errs = append(errs, fmt.Errorf("invariant 3: key %q has waiters but is not contended", key))
		}
		if tokenOfWord(s) > t.last {
			errs = append(errs, fmt.Errorf("invariant 3: key %q holder token %d > last token %d", key, tokenOfWord(s), t.last))
		}
		prevTok, n := tokenOfWord(s), 0
		var prev *Waiter[T]
		for w := e.head; w != nil; w = w.next {
			n++
			if w.state != Queued {
				errs = append(errs, fmt.Errorf("invariant 4: key %q waiter %d is %v in the queue", key, w.token, w.state))
			}
			if w.lock != e {
				errs = append(errs, fmt.Errorf("invariant 4: waiter %d queued under key %q has another key's entry", w.token, key))
			}
			if w.prev != prev {
				errs = append(errs, fmt.Errorf("invariant 4: key %q waiter %d has a wrong prev link", key, w.token))
			}
			if w.token <= prevTok || w.token > t.last {
				errs = append(errs, fmt.Errorf("invariant 3: key %q token %d after %d", key, w.token, prevTok))
			}
			prevTok, prev = w.token, w
			if n > e.waiting+1 {
				errs = append(errs, fmt.Errorf("invariant 4: key %q queue is longer than its count %d", key, e.waiting))
				break
			}
		}
		if e.tail != prev {
			errs = append(errs, fmt.Errorf("invariant 4: key %q tail is not the last waiter", key))
		}
		if n != e.waiting {
			errs = append(errs, fmt.Errorf("invariant 4: key %q counts %d waiters, queue has %d", key, e.waiting, n))
		}
		if n > 0 && n < len(byLen) {
			byLen[n]++
		}
		waiting += n
		longest = max(longest, n)
	}
	if waiting != t.waiting {
		errs = append(errs, fmt.Errorf("invariant 4: table counts %d waiters, queues hold %d", t.waiting, waiting))
	}
	if longest != t.longest || !slices.Equal(byLen, t.byLen) {
		errs = append(errs, fmt.Errorf("invariant 4: longest queue %d (by length %v), counted %d (%v)", t.longest, t.byLen, longest, byLen))
	}
	if quiescent && int64(heldKeys) != t.held.Load() {
		errs = append(errs, fmt.Errorf("invariant 1: %d keys held, Len says %d", heldKeys, t.held.Load()))
	}
	return errors.Join(errs...)
}
