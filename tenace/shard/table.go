package shard

import (
	"errors"
	"fmt"
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

// Waiter is one acquire request. The caller owns Value and may read Token and
// State once the table has reported the waiter's outcome; the table owns every
// other field from the call that hands it the waiter until that outcome.
//
// A waiter may be reused for a later request once its outcome was reported,
// with one exception: a Granted waiter that may still be passed to
// [Table.Cancel] (the abort-during-grant case) must not be reused before that
// call, because Cancel reads its key and token.
type Waiter[T any] struct {
	// Value is the caller's data (the shard goroutine keeps the reply
	// channel here). The table never reads or writes it.
	Value T

	key        string
	token      uint64
	state      State
	prev, next *Waiter[T]
}

// Token is the grant token the table gave the waiter when it arrived.
func (w *Waiter[T]) Token() uint64 { return w.token }

// State is where the waiter stands.
func (w *Waiter[T]) State() State { return w.state }

// Key is the key the waiter asked for.
func (w *Waiter[T]) Key() string { return w.key }

// entry is one key's lock: its holder and its FIFO queue of waiters.
type entry[T any] struct {
	holder     uint64     // token of the current grant; never 0 (see invariant 1)
	head, tail *Waiter[T] // FIFO queue, oldest first
	waiting    int
}

// Table is one shard's lock table: a pure, deterministic state machine. It has
// no goroutines, channels, clock or randomness: requests go in as method
// calls, and the effects (which waiter is granted now) come out as return
// values for the caller to deliver.
//
// Concurrency: a Table is not safe for concurrent use. In the lock manager it
// is owned by exactly one shard goroutine, which is the only code that calls
// its methods; no mutex guards it because nothing else can reach it.
//
// Tokens: every request gets the next value of a table-wide counter when it
// arrives (1, 2, 3, …). Because each key grants in arrival order, the tokens a
// key grants strictly increase, grant after grant: they are fencing tokens,
// and they tell a current grant from a stale one, so a release or cancel that
// names an earlier grant does nothing.
//
// Invariants (checked by [Table.CheckInvariants]):
//  1. A key has an entry iff it is held: entry.holder != 0. A key with
//     waiters is always held, because a free key grants its first arrival at
//     once. So a key with neither holder nor waiters has no entry, and an
//     idle table is empty.
//  2. At most one holder per key (the entry has one holder field).
//  3. Tokens strictly increase along holder, queue head, …, queue tail, and
//     every token is at most the last one handed out.
//  4. Every queued waiter has state Queued and the key of the queue it is in;
//     the queue's links and count agree.
//
// Fairness: a key is granted in arrival order — the order in which the table
// receives the requests, which for the shard goroutine is the order the
// acquire messages reach its mailbox, not the order callers called Acquire.
// The exceptions, each deliberate:
//   - a TryAcquire never queues: it succeeds only on a free key, and a key
//     with waiters is never free (invariant 1), so a try cannot overtake a
//     waiter, it can only fail;
//   - a waiter that cancels leaves the queue and loses its place; the ones
//     behind it move up;
//   - a waiter cancelled after its grant (abort during grant) does not keep
//     the lock: its grant passes at once to the next waiter in line, which is
//     what that waiter would have got had the cancel come first.
type Table[T any] struct {
	entries map[string]entry[T]
	last    uint64 // last token handed out
	waiting int    // waiters queued over all keys
}

// NewTable returns an empty table.
func NewTable[T any]() *Table[T] {
	return &Table[T]{entries: make(map[string]entry[T])}
}

func (t *Table[T]) arrive(key string, w *Waiter[T]) {
	t.last++
	w.key, w.token, w.prev, w.next = key, t.last, nil, nil
}

// Acquire hands w to the table for key. If key is free, w is granted at once
// and Acquire reports true; otherwise w is queued behind the key's waiters
// and will be returned, when its turn comes, by the Release or Cancel that
// frees the key.
func (t *Table[T]) Acquire(key string, w *Waiter[T]) (granted bool) {
	t.arrive(key, w)
	e, held := t.entries[key]
	if mutant == "idlekey" && held && e.holder == 0 {
		held = false // mutant: an idle entry left behind counts as free
	}
	if !held {
		w.state = Granted
		t.entries[key] = entry[T]{holder: w.token}
		return true
	}
	w.state = Queued
	if e.tail == nil {
		e.head = w
	} else {
		e.tail.next, w.prev = w, e.tail
	}
	e.tail = w
	e.waiting++
	t.waiting++
	t.entries[key] = e
	return false
}

// TryAcquire grants w if key is free and refuses it otherwise; w never queues.
func (t *Table[T]) TryAcquire(key string, w *Waiter[T]) (granted bool) {
	t.arrive(key, w)
	e, held := t.entries[key]
	if mutant == "idlekey" && held && e.holder == 0 {
		held = false
	}
	if held && mutant != "doublegrant" { // mutant: grant a held key
		w.state = Refused
		return false
	}
	w.state = Granted
	e.holder = w.token
	t.entries[key] = e
	return true
}

// Release ends the grant token on key. If token is the current grant, the key
// passes to its oldest waiter, returned as next (nil when nobody waits, and
// the key's entry is removed). A stale or unknown token changes nothing and
// reports released false.
func (t *Table[T]) Release(key string, token uint64) (released bool, next *Waiter[T]) {
	e, held := t.entries[key]
	if !held || (e.holder != token && mutant != "stalerelease") { // mutant: any token frees the holder
		return false, nil
	}
	return true, t.handOn(key, e)
}

// handOn gives key, whose holder is done, to its oldest waiter.
func (t *Table[T]) handOn(key string, e entry[T]) *Waiter[T] {
	w := e.head
	if mutant == "lifo" {
		w = e.tail // mutant: the newest waiter first
	}
	if w == nil {
		if mutant == "idlekey" {
			e.holder = 0 // mutant: the idle key's entry stays
			t.entries[key] = e
			return nil
		}
		delete(t.entries, key)
		return nil
	}
	t.unlink(&e, w)
	e.holder = w.token
	t.entries[key] = e
	w.state = Granted
	return w
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
	e.waiting--
	t.waiting--
	w.prev, w.next = nil, nil
}

// Cancel withdraws w, whose caller gave up (its context ended or its timeout
// passed). What happens depends on how far w got:
//   - Queued: w leaves the queue; removed is true, and w is now Cancelled.
//   - Granted and still the key's holder (the grant landed while the caller
//     was giving up): the grant passes on as if released; next is the waiter
//     granted now, if any. This is how an abort during grant never leaks.
//   - otherwise (refused, already cancelled, or its grant already released):
//     nothing changes.
func (t *Table[T]) Cancel(w *Waiter[T]) (removed bool, next *Waiter[T]) {
	switch w.state {
	case Queued:
		if mutant == "ghostwaiter" {
			w.state = Cancelled // mutant: the cancelled waiter stays queued
			return true, nil
		}
		e := t.entries[w.key]
		t.unlink(&e, w)
		t.entries[w.key] = e
		w.state = Cancelled
		return true, nil
	case Granted:
		if mutant == "leakcancel" {
			return false, nil // mutant: a grant that raced the cancel is kept
		}
		_, next := t.Release(w.key, w.token)
		return false, next
	}
	return false, nil
}

// Len is the number of keys held or waited for.
func (t *Table[T]) Len() int { return len(t.entries) }

// Waiting is the number of waiters queued over all keys.
func (t *Table[T]) Waiting() int { return t.waiting }

// Holder returns the token of key's current grant.
func (t *Table[T]) Holder(key string) (token uint64, held bool) {
	e, held := t.entries[key]
	return e.holder, held
}

// Queue returns the tokens of key's waiters, oldest first.
func (t *Table[T]) Queue(key string) []uint64 {
	e := t.entries[key]
	var q []uint64
	for w := e.head; w != nil; w = w.next {
		q = append(q, w.token)
	}
	return q
}

// Drain empties the table and returns every queued waiter, oldest first per
// key, each now Cancelled. The shard goroutine calls it when it stops, to
// fail whoever still waits.
func (t *Table[T]) Drain() []*Waiter[T] {
	var out []*Waiter[T]
	for key, e := range t.entries {
		for w := e.head; w != nil; {
			next := w.next
			w.state, w.prev, w.next = Cancelled, nil, nil
			out = append(out, w)
			w = next
		}
		delete(t.entries, key)
	}
	t.waiting = 0
	return out
}

// CheckInvariants returns an error describing the first broken invariant of
// the Table type's doc, or nil. It walks the whole table: call it in tests.
func (t *Table[T]) CheckInvariants() error {
	var errs []error
	waiting := 0
	for key, e := range t.entries {
		if e.holder == 0 {
			errs = append(errs, fmt.Errorf("invariant 1: key %q has an entry but no holder", key))
		}
		if e.holder > t.last {
			errs = append(errs, fmt.Errorf("invariant 3: key %q holder token %d > last token %d", key, e.holder, t.last))
		}
		prevTok, n := e.holder, 0
		var prev *Waiter[T]
		for w := e.head; w != nil; w = w.next {
			n++
			if w.state != Queued {
				errs = append(errs, fmt.Errorf("invariant 4: key %q waiter %d is %v in the queue", key, w.token, w.state))
			}
			if w.key != key {
				errs = append(errs, fmt.Errorf("invariant 4: waiter %d for key %q is queued under %q", w.token, w.key, key))
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
		waiting += n
	}
	if waiting != t.waiting {
		errs = append(errs, fmt.Errorf("invariant 4: table counts %d waiters, queues hold %d", t.waiting, waiting))
	}
	return errors.Join(errs...)
}
