package shard

import (
	"cmp"
	"errors"
	"fmt"
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
	entry      *entry[T]  // the key's entry, once queued or granted
	prev, next *Waiter[T] // queue links; once granted, next is Also's link
	state      State
	shared     bool  // asks for the key shared (see SetShared)
	seen       seen  // what label and since hold once the waiter is Refused or Cancelled
	permits    int32 // the permit count it asks for, when shared

	// label is the caller's label for the request (see SetLabel), and
	// since when the waiter queued (the table's clock, see SetNow). Once
	// the waiter is Refused, or Cancelled from the queue, they are the
	// label and grant time of the key's holder it found instead (see
	// Seen): the request is over, and its own are no longer needed.
	label string
	since int64
	query *query // the shard's: the query a msgQuery carries; the table never reads it
}

// seen says what a Refused or Cancelled waiter's label and since name.
type seen uint8

const (
	seenNone      seen = iota // no holder: the key was free, or the waiter's own
	seenExclusive             // the key's exclusive holder
	seenShared                // the oldest of its shared holders
)

// SetLabel sets the caller's label for the request w carries, which
// Inspect shows with its wait and its grant. Like SetShared, it is set
// before w is handed to the table, every time.
func (w *Waiter[T]) SetLabel(label string) { w.label = label }

// Seen returns, for a waiter refused by TryAcquire or cancelled from the
// queue by Cancel, the key's holder it found then: its label and when it
// was granted (the oldest holder when the key was held shared; Token and
// Permits are not reported); ok is false when the key had no holder, or
// the waiter is neither Refused nor Cancelled.
func (w *Waiter[T]) Seen() (h HolderView, ok bool) {
	if w.seen == seenNone || (w.state != Refused && w.state != Cancelled) {
		return HolderView{}, false
	}
	return HolderView{Label: w.label, Since: w.since, Shared: w.seen == seenShared}, true
}

// SetShared sets the mode w asks for: exclusive (shared false, the zero
// value: the whole key) or shared (one permit of the key's permits; 0
// means no limit, a reader of a read/write lock). The table's owner sets
// it before it hands w to the table, never while the table may still read
// w (a Granted waiter that may still be passed to Cancel: Cancel reads its
// mode); it stays until the next call, so an owner that reuses waiters sets
// it every time. permits must be at least 0 and fit in an int32; the
// caller checks.
func (w *Waiter[T]) SetShared(shared bool, permits int) {
	w.shared, w.permits = shared, int32(permits)
}

// Also is the next waiter granted in the same step as w, when a release
// or cancel admitted several shared waiters at once: a caller handed a
// granted waiter by Release, ReleaseHeld or Cancel walks
// for w := next; w != nil; w = w.Also(). Valid only until any of those
// waiters is handed to the table again.
func (w *Waiter[T]) Also() *Waiter[T] {
	if w.state != Granted {
		return nil
	}
	return w.next
}

// Token is the grant token the table gave the waiter when it arrived.
func (w *Waiter[T]) Token() uint64 { return w.token }

// State is where the waiter stands.
func (w *Waiter[T]) State() State { return w.state }

// Held is what the holder of a grant keeps to release it: see
// [Table.ReleaseByCAS]. Its zero value holds nothing.
type Held[T any] struct {
	entry *entry[T]
	token uint64
}

// Held returns the grant w holds, for its holder to release; valid once w is
// Granted. A Held, or a copy, released a second time changes nothing: the
// table finds its grant no longer current.
func (w *Waiter[T]) Held() Held[T] {
	if w.shared {
		return Held[T]{entry: w.entry, token: w.token | sharedBit}
	}
	return Held[T]{entry: w.entry, token: w.token}
}

// Token is the grant's token.
func (h *Held[T]) Token() uint64 { return h.token &^ sharedBit }

// Shared reports whether h is a shared grant, which is released by message
// only ([Table.ReleaseHeld]), never by compare-and-swap.
func (h *Held[T]) Shared() bool { return h.token&sharedBit != 0 }

// sharedBit marks a shared grant's Held token (tokens stay below 2^62). It
// is set when the Held is made and never changes, so the holder may read it
// from any goroutine: nothing writes a Held once it is made.
const sharedBit = 1 << 63

// An entry's state word, the one field of the table that goroutines other
// than the owner touch (see Table, "Release by compare-and-swap"):
//
//	stFree              0          nobody holds the key; only the owner moves an entry out of free
//	stDead              1          the entry left the table (reaped, drained, or spare)
//	heldWord(t)         t<<1       grant t holds the key and nobody waits: its holder may CAS it to free
//	contendedWord(t)    t<<1 | 1   grant t holds the key and waiters may queue: only a message frees it
//	stShared            all ones   shared holders (entry.shared of them) hold the key: only messages free it
//
// Tokens start at 1 and stay below 2^62, so no held or contended word equals
// stFree, stDead or stShared; stShared has the contended bit, so no
// exclusive holder's CAS matches it.
const (
	stFree   uint64 = 0
	stDead   uint64 = 1
	stShared uint64 = ^uint64(0)
)

func heldWord(token uint64) uint64      { return token << 1 }
func contendedWord(token uint64) uint64 { return token<<1 | 1 }
func tokenOfWord(s uint64) uint64       { return s >> 1 }
func isContended(s uint64) bool         { return s&1 == 1 && s != stDead }

// isCurrent reports whether word s is held by grant token: held or
// contended, with that token.
func isCurrent(s, token uint64) bool {
	return s != stFree && s != stDead && tokenOfWord(s) == token
}

// entry is one key's lock: its state word and its FIFO queue of waiters.
// Everything but state is owned by the table's owner.
type entry[T any] struct {
	state      atomic.Uint64
	table      *Table[T] // the table the entry is made for, whatever key it has: a Held finds its table through it
	key        string
	head, tail *Waiter[T] // FIFO queue, oldest first
	waiting    int32      // the queue's length (an int32 keeps the entry in the 112-byte size class)
	idx        int32      // where the entry is in Table.all
	shared     int32      // shared holders, when the word is stShared
	permits    int32      // their permit count (0: no limit), set by the first of them

	// What Inspect shows of the holders: the exclusive holder's label and
	// grant time (when the word is held or contended; stale otherwise), and
	// the shared holders, in grant order, which is token order (when the
	// word is stShared).
	label   string
	since   int64
	readers []mark
}

// mark is one shared holder of a key: its token, label and grant time.
type mark struct {
	token uint64
	label string
	since int64
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
// atomics — the key's state word and the table's two counts — and never
// the map or the queues. Every other method is the owner's.
//
// Tokens: every request gets the next value of a table-wide counter when it
// arrives (1, 2, 3, …). Because each key grants in arrival order, the tokens a
// key grants strictly increase, grant after grant: they are fencing tokens,
// and they tell a current grant from a stale one, so a release or cancel that
// names an earlier grant does nothing.
//
// # Release by compare-and-swap
//
// Each entry has an atomic state word: free, heldWord(t), or
// contendedWord(t) (t is the grant's token). Only the owner moves an entry
// out of free (a grant), and only the owner sets the contended bit, in the
// same step in which it queues the first waiter. The holder of grant t
// releases with one compare-and-swap heldWord(t) → free; when that fails —
// the word is contendedWord(t): someone waits — it sends the release as a
// message instead, and the owner hands the key on in FIFO order. The swap is tried once and
// never looped on: it is not a lock, and the owner alone still decides who
// is granted. The owner never waits on a releaser and a releaser never waits
// on the owner.
//
// Why a CAS cannot overtake a waiter: the CAS succeeds only on a word
// without the contended bit, and the owner sets the bit before it queues
// anyone. If the owner's own CAS heldWord(t) → contendedWord(t) fails, the
// holder has just freed the key, and the owner grants the arriving waiter at once,
// as if its acquire had come after the release — which it did, in the order
// of the word's modifications.
//
// Reclaim: a key freed by CAS is no longer held (Len drops at once) but its
// entry is still in the map, free. [Table.Reap], run by the owner, sweeps
// the entries and deletes the free ones (a free word stays free while the
// owner looks: only the owner moves it out of free); a key freed and taken
// again before then keeps its entry, with no map delete and insert. A sweep
// is due once at least reapDepth entries are free and at least as many are
// free as held ([Table.ReapDue]), so a sweep so triggered walks at most
// twice the entries it frees (O(1) per release, amortized), and a table
// with no traffic keeps fewer free entries than reapDepth or than the keys
// it holds, whichever is more: fewer than reapDepth once nothing is held.
// (A Sync's sweep walks every entry.) The releaser whose CAS finds the
// sweep due (it reads the owner's published entry count after its own
// decrement of the held count) asks the owner for it; the owner checks
// after every batch, which covers whatever it changed itself. The owner
// recycles entries, so that a busy table does not allocate one per key.
//
// Happens-before: a release by CAS is an atomic write that the owner's next
// read of the word observes before it grants the key again, and the grant
// then travels to the next holder on a channel: what the releaser wrote
// before Release is visible to the next holder. A released-by-message grant
// is ordered by the mailbox.
//
// Invariants (checked by [Table.CheckInvariants]):
//  1. Every entry in the map is under its own key and its word is free,
//     heldWord(t) or contendedWord(t), never dead. A key is held iff its
//     entry's word is held or contended; Len counts them. A free entry has no
//     waiters: it is waiting only for Reap. An idle table that Reap got
//     through is empty. The entry list holds exactly the map's entries,
//     each at its own index.
//  2. At most one holder per key (the word names one token).
//  3. A key with waiters is contended (so its holder cannot free it by CAS);
//     tokens strictly increase along holder, queue head, …, queue tail, and
//     every token is at most the last one handed out.
//  4. Every queued waiter has state Queued and the entry of the queue it is
//     in; the queue's links and counts agree.
//  5. A key held shared has at least one shared holder and no more than its
//     permits (when limited), and its queue's head is one it cannot admit
//     (an exclusive waiter, or a shared one while every permit is taken);
//     it keeps one mark per shared holder, in token order (what Inspect
//     shows); a key not held shared counts no shared holder and no mark.
//  6. The counts by mode ([Table.SharedStats]) are those of the entries:
//     the keys held shared, the sum of their shared holders, and the
//     queued waiters that ask for their key shared.
//
// # Shared holders
//
// A waiter may ask for its key shared ([Waiter.SetShared]): it then takes
// one of the key's permits, and shared holders hold the key together — any
// number of them when the permit count is 0 (the readers of a read/write
// lock), at most that many otherwise (a keyed bulkhead). An exclusive
// waiter takes the whole key. The first shared holder of a key
// not held shared sets the count; those admitted beside it share it,
// whatever count they asked for. Shared holders release by message only
// (ReleaseHeld): the word of a key held shared is stShared, which no CAS
// matches, and the entry counts them.
//
// Admission stays first come, first served: a waiter is granted at once
// only when nobody waits for the key, and a release or cancel admits
// waiters from the head of the queue while they fit, stopping at the first
// that does not (a writer while readers hold the key, a reader while the
// permits are all taken). So a waiting writer is not overtaken by readers
// that arrive after it, and a reader never starves a writer; the price is
// that a reader behind a waiting writer waits though a permit is free, as
// x/sync/semaphore makes a small request wait behind a large one — letting
// it through would let a stream of readers keep the writer waiting
// forever.
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
	heldKeys atomic.Int64 // keys held: words held or contended
	mapped   atomic.Int64 // entries in the map, as the owner last published it

	// shard is the shard that owns the table, or nil for a table used on
	// its own: a Grant reaches its shard through its entry's table, so
	// that it need not keep a pointer of its own (see Grant). Set once,
	// before any entry is made.
	shard *Shard

	// Owned by the table's owner.
	entries map[string]*entry[T]
	all     []*entry[T] // the map's entries, in no order: what Reap walks (iterating a Go map costs its capacity, not its length)
	peak    int         // most entries since the map was last rebuilt
	spare   []*entry[T] // recycled entries, all dead
	last    uint64      // last token handed out
	now     int64       // the owner's clock, for grant and wait times (SetNow)
	waiting int         // waiters queued over all keys
	byLen   []int       // byLen[n]: keys with exactly n waiters (n ≥ 1)
	longest int         // the longest queue: the largest n with byLen[n] > 0

	// The counts by mode (see SharedStats), kept where the shared paths
	// change them: an exclusive grant or release never touches them.
	sharedKeys    int // keys held shared: words stShared
	sharedHolders int // their shared holders: the sum of their entries' shared
	sharedWaiting int // queued waiters that ask for their key shared
}

// NewTable returns an empty table.
func NewTable[T any]() *Table[T] {
	return &Table[T]{entries: make(map[string]*entry[T])}
}

// reapDepth: a sweep is due once at least reapDepth entries are free and at
// least as many are free as held (see ReapDue). Once every release has
// returned and the owner has handled its messages, a table keeps fewer free
// entries than reapDepth or than the keys it holds, whichever is more.
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
	w.token, w.entry, w.prev, w.next, w.seen = t.last, nil, nil, nil, seenNone
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
	if e.head == nil && admits(e, s, w) {
		// Nobody waits, so w overtakes no one.
		t.grantFree(e, s, w)
		return true
	}
	if e.head == nil && !isContended(s) && !e.state.CompareAndSwap(s, contendedWord(tokenOfWord(s))) {
		// The holder freed the key by CAS since the Load: grant w, as
		// the release came first in the word's order.
		t.grantFree(e, stFree, w)
		return true
	}
	// The word is contended now: the holder's CAS fails from here on, and
	// its release comes as a message.
	w.state, w.entry, w.since = Queued, e, t.now
	if e.tail == nil {
		e.head = w
	} else {
		e.tail.next, w.prev = w, e.tail
	}
	e.tail = w
	t.queueGrew(e, w)
	return false
}

// TryAcquire grants w if Acquire would grant it at once, and refuses it
// otherwise; w never queues.
func (t *Table[T]) TryAcquire(key string, w *Waiter[T]) (granted bool) {
	t.arrive(w)
	e := t.entries[key]
	if e == nil {
		t.grantNew(key, w)
		return true
	}
	if s := e.state.Load(); e.head == nil && admits(e, s, w) {
		t.grantFree(e, s, w)
		return true
	}
	w.state = Refused
	see(e, w)
	return false
}

// grantNew makes key's entry and grants it to w.
func (t *Table[T]) grantNew(key string, w *Waiter[T]) {
	var e *entry[T]
	if n := len(t.spare); n > 0 {
		e, t.spare[n-1] = t.spare[n-1], nil
		t.spare = t.spare[:n-1]
	} else {
		e = &entry[T]{table: t}
	}
	e.key, e.idx = key, int32(len(t.all))
	t.entries[key] = e
	t.all = append(t.all, e)
	t.mapped.Store(int64(len(t.all)))
	t.peak = max(t.peak, len(t.entries))
	t.grantFree(e, stFree, w)
}

// grantFree grants e, whose word is s and which admits w, to w, which
// nobody waits before: a free key, or one more shared holder.
func (t *Table[T]) grantFree(e *entry[T], s uint64, w *Waiter[T]) {
	if s == stFree {
		t.heldKeys.Add(1)
	}
	t.grant(e, w, s != stShared)
}

// grant makes w a holder of e: when vacant (nobody holds e, or its holder
// is done) its first holder, else one more shared holder. Plain stores are
// enough: only the owner moves a word out of free, writes a contended or
// shared word, or an entry's counts; no releaser's CAS matches free,
// contended or shared.
func (t *Table[T]) grant(e *entry[T], w *Waiter[T], vacant bool) {
	switch {
	case w.shared:
		if vacant {
			// The first shared holder sets the key's permit count;
			// those admitted beside it share it.
			e.state.Store(stShared)
			e.shared, e.permits = 0, w.permits
			t.sharedKeys++
		}
		e.shared++
		t.sharedHolders++
		e.readers = append(e.readers, mark{token: w.token, label: w.label, since: t.now})
	case e.head == nil:
		e.state.Store(heldWord(w.token))
		e.label, e.since = w.label, t.now
	default:
		e.state.Store(contendedWord(w.token))
		e.label, e.since = w.label, t.now
	}
	w.state, w.entry = Granted, e
}

// admits reports whether e, whose word is s, can take w now, had w nobody
// before it: when e is free; when w is shared, e is held shared and a
// permit is free. A waiter that it does not admit waits, and so does
// everyone behind it (see Table, "Shared holders").
func admits[T any](e *entry[T], s uint64, w *Waiter[T]) bool {
	if s == stFree {
		return true
	}
	return s == stShared && w.shared && (e.permits == 0 || e.shared < e.permits)
}

// ReleaseByCAS is the holder's release of h, from any goroutine: one
// compare-and-swap heldWord(token) → free (a second try of the same grant
// fails: tokens are never reused). It reports true when that freed the
// key, and then reap reports that a sweep is due (see ReapDue): the caller
// should wake the owner. It reports false when the key has waiters (or the
// grant is stale, or the table was drained): the caller must send the
// release to the owner, who calls [Table.ReleaseHeld] with h.
//
// Why a due sweep is never missed: the count of entries it reads is the
// owner's latest, or the owner stores a newer one later in a batch — and
// after every batch the owner checks ReapDue itself, with a held count
// that includes this release (the decrement came before the read). Each
// atomic is used once, never looped on.
func (t *Table[T]) ReleaseByCAS(h *Held[T]) (released, reap bool) {
	if h.token&sharedBit != 0 || h.entry == nil || !h.entry.state.CompareAndSwap(heldWord(h.token), stFree) {
		return false, false
	}
	n := t.heldKeys.Add(-1)
	return true, reapDue(t.mapped.Load(), n)
}

// reapDue: at least reapDepth of mapped entries are free, and at least as
// many are free as held.
func reapDue(mapped, held int64) bool {
	free := mapped - held
	return free >= reapDepth && free >= held
}

// Reap deletes every free entry: the keys freed by CAS and not taken
// again. It walks every entry, held ones too (a sweep), so the owner calls
// it when it is due (Tidy), and before a Sync barrier (a test's tool); it
// also rebuilds the map when it has shrunk far below its peak (see
// shrinkMin).
func (t *Table[T]) Reap() {
	// Backwards: remove moves the last entry into the hole, and the last
	// was already looked at.
	for i := len(t.all) - 1; i >= 0; i-- {
		if e := t.all[i]; e.state.Load() == stFree {
			t.remove(e)
		}
	}
	t.shrink()
}

// Tidy is the owner's housekeeping after each batch: Reap when it is due,
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

// ReapDue reports whether a sweep is due: at least reapDepth entries are
// free, and at least as many are free as held. An owner that reaps only
// then (and at a barrier) lets a key freed and taken again between two
// sweeps keep its entry, and walks at most twice the entries a sweep
// frees. It costs one atomic load.
func (t *Table[T]) ReapDue() bool {
	return reapDue(int64(len(t.all)), t.heldKeys.Load())
}

// shrink rebuilds the map, the entry list and the queue-length counts when
// they have shrunk far below their peak (see shrinkMin).
func (t *Table[T]) shrink() {
	if t.peak >= shrinkMin && len(t.entries) <= t.peak/shrinkRatio {
		t.entries = maps_clone(t.entries)
		t.all = slices.Clone(t.all)
		t.peak = len(t.entries)
	}
	if cap(t.byLen) > shrinkMin && t.longest < cap(t.byLen)/shrinkRatio {
		t.byLen = slices.Clone(t.byLen[:t.longest+1])
	}
}

// remove deletes e from the map and the entry list, and recycles it.
func (t *Table[T]) remove(e *entry[T]) {
	delete(t.entries, e.key)
	last := len(t.all) - 1
	moved := t.all[last]
	t.all[e.idx], moved.idx = moved, e.idx
	t.all[last] = nil
	t.all = t.all[:last]
	t.mapped.Store(int64(last))
	t.recycle(e)
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
	e.key, e.head, e.tail, e.waiting, e.shared, e.permits = "", nil, nil, 0, 0, 0
	e.label = ""
	clear(e.readers)
	e.readers = e.readers[:0]
	if len(t.spare) < spareMax {
		t.spare = append(t.spare, e)
	}
}

// ReleaseHeld is [Table.Release] of the grant h: the message a holder
// sends when its CAS found waiters. It needs no map lookup: h names the
// entry, and the entry's word says whether h is still its grant.
//
// A shared grant is released this way only: the first call gives its
// permit back, and next is the first of the waiters that admitted, in
// order (see [Waiter.Also]); a later call, of h or of a copy, finds no
// shared holder of h's token and changes nothing. h is only read.
func (t *Table[T]) ReleaseHeld(h *Held[T]) (released bool, next *Waiter[T]) {
	e := h.entry
	if e == nil {
		return false, nil
	}
	s := e.state.Load()
	if h.token&sharedBit != 0 {
		if s != stShared {
			return false, nil // released, or drained
		}
		return t.leaveShared(e, h.Token())
	}
	if !isCurrent(s, h.token) {
		return false, nil
	}
	return true, t.handOn(e, s, true)
}

// leaveShared ends the shared grant token of e, whose word is stShared,
// and admits whom that lets in; left is false, and nothing changes, when
// token is none of e's shared holders (its grant was released, or e was
// recycled: tokens are never reused, and every shared holder has its mark,
// invariant 5).
func (t *Table[T]) leaveShared(e *entry[T], token uint64) (left bool, next *Waiter[T]) {
	i, ok := slices.BinarySearchFunc(e.readers, token, func(m mark, token uint64) int { return cmp.Compare(m.token, token) })
	if !ok {
		return false, nil
	}
	e.readers = slices.Delete(e.readers, i, i+1)
	e.shared--
	t.sharedHolders--
	if e.shared == 0 {
		t.sharedKeys--
	}
	return true, t.handOn(e, stShared, e.shared == 0)
}

// Release ends the exclusive grant token on key: the message path, for a
// holder whose CAS found waiters. If token is the current grant, the key
// passes to its oldest waiter, returned as next (nil when nobody waits, and
// the key's entry is removed; when the oldest waiters are shared, several
// may be granted: see [Waiter.Also]). A stale or unknown token, or a shared
// grant's (release those with ReleaseHeld), changes nothing and reports
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
	return true, t.handOn(e, s, true)
}

// handOn admits e's oldest waiters after its holders changed (word s):
// vacant when nobody holds e any more. It grants waiters in order while
// they fit — one exclusive waiter, or shared waiters while permits last —
// and stops at the first that does not, which keeps its place at the head.
// It returns the first granted, the others linked behind it (Also).
func (t *Table[T]) handOn(e *entry[T], s uint64, vacant bool) *Waiter[T] {
	if vacant && e.head == nil {
		// Nobody waits. A held (not contended) word's holder may free it by
		// CAS at this moment only if it is releasing twice; if it did, the
		// key is free and Reap deletes it.
		if e.state.CompareAndSwap(s, stDead) {
			t.heldKeys.Add(-1)
			t.remove(e)
		}
		return nil
	}
	var first, last *Waiter[T]
	for {
		w := e.head
		if w == nil || (!vacant && !admits(e, s, w)) {
			return first
		}
		t.unlink(e, w)
		// The new holder may use CAS when it is exclusive and nobody
		// waits behind it (see grant).
		t.grant(e, w, vacant)
		if first == nil {
			first = w
		} else {
			last.next = w
		}
		last, vacant, s = w, false, e.state.Load()
	}
}

// queueGrew and queueShrank keep the waiting counts and the longest queue,
// as w joins or leaves e's queue.
func (t *Table[T]) queueGrew(e *entry[T], w *Waiter[T]) {
	if w.shared {
		t.sharedWaiting++
	}
	if e.waiting > 0 {
		t.byLen[e.waiting]--
	}
	e.waiting++
	t.waiting++
	for len(t.byLen) <= int(e.waiting) {
		t.byLen = append(t.byLen, 0)
	}
	t.byLen[e.waiting]++
	t.longest = max(t.longest, int(e.waiting))
}

func (t *Table[T]) queueShrank(e *entry[T], w *Waiter[T]) {
	if w.shared {
		t.sharedWaiting--
	}
	t.byLen[e.waiting]--
	if int(e.waiting) == t.longest && t.byLen[e.waiting] == 0 {
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
	t.queueShrank(e, w)
	w.prev, w.next = nil, nil
}

// Cancel withdraws w, whose caller gave up (its context ended or its timeout
// passed). What happens depends on how far w got:
//   - Queued: w leaves the queue; removed is true, and w is now Cancelled.
//     If it was the last waiter, the key is held but no longer contended,
//     so its holder can release by CAS again.
//     When the key is held shared, the waiters behind w that it was
//     blocking are granted now (next, with Also).
//   - Granted and still the key's holder (the grant landed while the caller
//     was giving up): the grant passes on as if released; next is the waiter
//     granted now, if any. This is how an abort during grant never leaks.
//     The caller never released that grant (it never had a lease), so the
//     word still names it. A shared grant gives its permit back, and w is
//     Cancelled.
//   - otherwise (refused, already cancelled, or its grant already released):
//     nothing changes.
func (t *Table[T]) Cancel(w *Waiter[T]) (removed bool, next *Waiter[T]) {
	switch w.state {
	case Queued:
		w.state = Cancelled
		e := w.entry
		t.unlink(e, w)
		see(e, w)
		s := e.state.Load()
		if s == stShared {
			// w may have been the head that blocked those behind it.
			return true, t.handOn(e, s, false)
		}
		if e.head == nil {
			// A plain store: nobody but the owner writes a contended word.
			e.state.Store(heldWord(tokenOfWord(s)))
		}
		return true, nil
	case Granted:
		e := w.entry
		if e == nil {
			break
		}
		s := e.state.Load()
		if w.shared {
			// Its Grant was never handed out, so nobody else can end it:
			// the permit is still taken, unless the table was drained.
			if s == stShared {
				w.state = Cancelled // a second Cancel gives back nothing
				_, next := t.leaveShared(e, w.token)
				return false, next
			}
		} else if isCurrent(s, w.token) {
			return false, t.handOn(e, s, true)
		}
	}
	return false, nil
}

// see records in w, which the table refuses or withdraws from e's queue,
// e's holder at this moment (see Waiter.Seen).
func see[T any](e *entry[T], w *Waiter[T]) {
	switch s := e.state.Load(); {
	case s == stShared && len(e.readers) > 0:
		w.seen, w.label, w.since = seenShared, e.readers[0].label, e.readers[0].since
	case s == stFree || s == stDead || s == stShared:
		w.seen = seenNone
	default:
		w.seen, w.label, w.since = seenExclusive, e.label, e.since
	}
}

// SetNow sets the table's clock: the time it records as the grant time of
// each grant, and the queueing time of each waiter, until the next call.
// The owner calls it before each step (the shard, once per batch: its
// monotonic nanoseconds since the group started). The table reads no
// clock of its own.
func (t *Table[T]) SetNow(now int64) { t.now = now }

// Len is the number of keys held or waited for (a key with waiters is
// held). It is exact at once after a release by CAS, and safe to call from
// any goroutine.
func (t *Table[T]) Len() int { return int(t.heldKeys.Load()) }

// Entries is the number of entries in the map: the keys held, plus keys
// freed by CAS that Reap has not deleted yet.
func (t *Table[T]) Entries() int { return len(t.entries) }

// Waiting is the number of waiters queued over all keys.
func (t *Table[T]) Waiting() int { return t.waiting }

// Longest is the number of waiters of the key with the most.
func (t *Table[T]) Longest() int { return t.longest }

// SharedStats counts the table by mode: keys is the number of keys held
// shared (counted by Len too), holders their shared holders over all keys
// (the permits in use), waiting the queued waiters that ask for their key
// shared (counted by Waiting too). Like Waiting, they are the owner's.
func (t *Table[T]) SharedStats() (keys, holders, waiting int) {
	return t.sharedKeys, t.sharedHolders, t.sharedWaiting
}

// Holder returns the token of key's current exclusive grant, and ok true
// when key is held: 0 and true when shared holders hold it (see Shared), 0
// and false when nobody does.
func (t *Table[T]) Holder(key string) (token uint64, ok bool) {
	e := t.entries[key]
	if e == nil {
		return 0, false
	}
	s := e.state.Load()
	switch s {
	case stFree:
		return 0, false
	case stShared:
		return 0, true
	}
	return tokenOfWord(s), true
}

// Shared returns how many shared holders key has, and their permit count
// (0: no limit); 0, 0 when it has none.
func (t *Table[T]) Shared(key string) (holders, permits int) {
	e := t.entries[key]
	if e == nil || e.state.Load() != stShared {
		return 0, 0
	}
	return int(e.shared), int(e.permits)
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
			t.heldKeys.Add(-1)
		}
		delete(t.entries, key)
	}
	t.mapped.Store(0)
	t.entries, t.all, t.spare, t.byLen = make(map[string]*entry[T]), nil, nil, nil
	t.peak, t.waiting, t.longest = 0, 0, 0
	t.sharedKeys, t.sharedHolders, t.sharedWaiting = 0, 0, 0
	return out
}

// CheckInvariants returns an error describing the first broken invariants of
// the Table type's doc, or nil. It walks the whole table: call it in tests,
// with no release by CAS running at the same time (see checkInvariants).
func (t *Table[T]) CheckInvariants() error { return t.checkInvariants(true) }

// checkInvariants is CheckInvariants; with quiescent false it skips what a
// concurrent release by CAS may change mid-walk (a held word becoming free,
// the held count), for the shard's verify build. It checks each entry, then
// the listing of entries, then the table's counts against the entries'.
func (t *Table[T]) checkInvariants(quiescent bool) error {
	var errs []error
	c := invariantCounts{byLen: make([]int, len(t.byLen))}
	for key, e := range t.entries {
		errs = append(errs, t.checkEntry(key, e, &c)...)
	}
	errs = append(errs, t.checkListing(quiescent)...)
	errs = append(errs, t.checkCounts(&c, quiescent)...)
	return errors.Join(errs...)
}

// invariantCounts is what checkInvariants counts over the entries, to compare
// with the table's own counts.
type invariantCounts struct {
	waiting, heldKeys, longest               int
	sharedKeys, sharedHolders, sharedWaiting int
	byLen                                    []int
}

// checkEntry checks the entry of key (invariants 1, 3, 4 and 5) and adds it
// to c.
func (t *Table[T]) checkEntry(key string, e *entry[T], c *invariantCounts) []error {
	var errs []error
	s := e.state.Load()
	if e.key != key {
		errs = append(errs, fmt.Errorf("invariant 1: key %q has the entry of %q", key, e.key))
	}
	if s == stDead {
		return append(errs, fmt.Errorf("invariant 1: key %q has a dead entry", key))
	}
	if s != stFree {
		c.heldKeys++
	}
	if s == stFree && e.head != nil {
		errs = append(errs, fmt.Errorf("invariant 3: key %q is free with waiters", key))
	}
	if e.head != nil && !isContended(s) {
		errs = append(errs, fmt.Errorf("invariant 3: key %q has waiters but is not contended", key))
	}
	errs = append(errs, checkShared(key, e, s, c)...)
	if tokenOfWord(s) > t.last && s != stShared {
		errs = append(errs, fmt.Errorf("invariant 3: key %q holder token %d > last token %d", key, tokenOfWord(s), t.last))
	}
	n, qerrs := t.checkQueue(key, e, s, c)
	errs = append(errs, qerrs...)
	if n > 0 && n < len(c.byLen) {
		c.byLen[n]++
	}
	c.waiting += n
	c.longest = max(c.longest, n)
	return errs
}

// checkShared checks invariant 5 on the entry of key, whose word is s, and
// counts it in c if it is held shared.
func checkShared[T any](key string, e *entry[T], s uint64, c *invariantCounts) []error {
	if s != stShared {
		if e.shared != 0 || len(e.readers) != 0 {
			return []error{fmt.Errorf("invariant 5: key %q counts %d shared holders but is not held shared", key, e.shared)}
		}
		return nil
	}
	var errs []error
	c.sharedKeys++
	c.sharedHolders += int(e.shared)
	if e.shared < 1 || (e.permits > 0 && e.shared > e.permits) || e.permits < 0 {
		errs = append(errs, fmt.Errorf("invariant 5: key %q has %d shared holders of %d permits", key, e.shared, e.permits))
	}
	if w := e.head; w != nil && admits(e, s, w) {
		errs = append(errs, fmt.Errorf("invariant 5: key %q keeps waiter %d that it admits", key, w.token))
	}
	if len(e.readers) != int(e.shared) || !slices.IsSortedFunc(e.readers, func(a, b mark) int { return cmp.Compare(a.token, b.token) }) {
		errs = append(errs, fmt.Errorf("invariant 5: key %q has %d shared holders and %d marks of them", key, e.shared, len(e.readers)))
	}
	return errs
}

// checkQueue checks the queue of key's entry, whose word is s (invariants 3
// and 4), counts its shared waiters in c, and returns its length.
func (t *Table[T]) checkQueue(key string, e *entry[T], s uint64, c *invariantCounts) (int, []error) {
	var errs []error
	prevTok, n := tokenOfWord(s), 0
	if s == stShared {
		prevTok = 0
	}
	var prev *Waiter[T]
	for w := e.head; w != nil; w = w.next {
		n++
		if w.shared {
			c.sharedWaiting++
		}
		if w.state != Queued {
			errs = append(errs, fmt.Errorf("invariant 4: key %q waiter %d is %v in the queue", key, w.token, w.state))
		}
		if w.entry != e {
			errs = append(errs, fmt.Errorf("invariant 4: waiter %d queued under key %q has another key's entry", w.token, key))
		}
		if w.prev != prev {
			errs = append(errs, fmt.Errorf("invariant 4: key %q waiter %d has a wrong prev link", key, w.token))
		}
		if w.token <= prevTok || w.token > t.last {
			errs = append(errs, fmt.Errorf("invariant 3: key %q token %d after %d", key, w.token, prevTok))
		}
		prevTok, prev = w.token, w
		if n > int(e.waiting)+1 {
			errs = append(errs, fmt.Errorf("invariant 4: key %q queue is longer than its count %d", key, e.waiting))
			break
		}
	}
	if e.tail != prev {
		errs = append(errs, fmt.Errorf("invariant 4: key %q tail is not the last waiter", key))
	}
	if n != int(e.waiting) {
		errs = append(errs, fmt.Errorf("invariant 4: key %q counts %d waiters, queue has %d", key, e.waiting, n))
	}
	return n, errs
}

// checkListing checks invariant 1 on the list of entries: the map's entries,
// each at its index, all published (when quiescent).
func (t *Table[T]) checkListing(quiescent bool) []error {
	var errs []error
	if len(t.all) != len(t.entries) {
		errs = append(errs, fmt.Errorf("invariant 1: %d entries listed, %d in the map", len(t.all), len(t.entries)))
	}
	for i, e := range t.all {
		if int(e.idx) != i || t.entries[e.key] != e {
			errs = append(errs, fmt.Errorf("invariant 1: listed entry %d (key %q, index %d) is not the map's", i, e.key, e.idx))
			break
		}
	}
	if quiescent && t.mapped.Load() != int64(len(t.all)) {
		errs = append(errs, fmt.Errorf("invariant 1: %d entries published, %d listed", t.mapped.Load(), len(t.all)))
	}
	return errs
}

// checkCounts checks the table's counts against c, counted over the entries
// (invariants 1, 4 and 6; the held count only when quiescent).
func (t *Table[T]) checkCounts(c *invariantCounts, quiescent bool) []error {
	var errs []error
	if c.waiting != t.waiting {
		errs = append(errs, fmt.Errorf("invariant 4: table counts %d waiters, queues hold %d", t.waiting, c.waiting))
	}
	if c.sharedKeys != t.sharedKeys || c.sharedHolders != t.sharedHolders || c.sharedWaiting != t.sharedWaiting {
		errs = append(errs, fmt.Errorf("invariant 6: table counts %d keys held shared by %d holders and %d shared waiters, entries hold %d, %d and %d",
			t.sharedKeys, t.sharedHolders, t.sharedWaiting, c.sharedKeys, c.sharedHolders, c.sharedWaiting))
	}
	if c.longest != t.longest || !slices.Equal(c.byLen, t.byLen) {
		errs = append(errs, fmt.Errorf("invariant 4: longest queue %d (by length %v), counted %d (%v)", t.longest, t.byLen, c.longest, c.byLen))
	}
	if quiescent && int64(c.heldKeys) != t.heldKeys.Load() {
		errs = append(errs, fmt.Errorf("invariant 1: %d keys held, Len says %d", c.heldKeys, t.heldKeys.Load()))
	}
	return errs
}
