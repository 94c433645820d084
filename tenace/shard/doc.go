// Package shard is the lock manager's core: one shard's lock table as a pure
// state machine ([Table]), the shard goroutine that runs it ([Shard]), and
// the [Group] that routes each key to its shard.
//
// # Design
//
//	callers (any goroutine)                    shard goroutines
//	─────────────────────────                 ─────────────────────────────
//	Acquire(k) ──┐  xxhash(k)·N>>64            ┌──────────────────────────┐
//	Release(k) ──┼──────────────► mailbox ───► │ actor loop: drain batch, │
//	 (waiters)   │   (buffered chan,           │ apply to Table, tidy,    │
//	cancel(w)  ──┘    FIFO per shard)          │ publish, deliver replies │
//	                                           └────────────┬─────────────┘
//	waiter's reply chan (buffer 1) ◄──── grant / refused / cancelled / closed
//
//	Release(k), nobody waiting: CAS k's word heldWord(t) → free; the shard
//	sweeps free entries once 64, and as many as are held, wait
//
// Each shard goroutine alone owns its Table: the holders and FIFO wait
// queues of its keys. Acquire and cancel reach it only as messages on its
// mailbox (package actor); grants go back on a per-waiter reply channel with
// a buffer of one, so the shard never blocks on a caller that stopped
// listening. A release is one compare-and-swap on the key's state word when
// nobody waits, and a message when someone does (the shard marks the word
// contended before it queues anyone, so the CAS fails exactly then): the
// common uncontended release costs the shard nothing. No mutex, semaphore or
// spin lock guards the lock state: every atomic is used once, never looped
// on (the release's CAS, the held count's decrement, the entry count's read),
// and only the shard grants; ownership by one goroutine is the whole
// concurrency story, and the mailbox's FIFO order is the whole ordering
// story. [Table] gives the protocol and why it keeps the arrival order.
//
// The holder's handle is a [Grant] the shard made for that grant alone, cut
// from a slab of 32 that the shard allocates on its own goroutine and never
// reuses: the memory provider hands it out as its lease, so an acquire
// allocates nothing of its own.
//
// The Table is where the protocol lives, with no goroutines, channels or
// clock: methods take a request and return its effects (the waiter granted
// now). That makes every rule of the lock manager testable step by step
// against a plain model, and the shard goroutine a thin loop: receive a
// batch, call the table, tidy it, publish the size, deliver the replies.
//
// # Fairness
//
// A key is granted in arrival order: the order in which its shard receives
// the acquire messages. Two callers that call Acquire at once arrive in the
// order their sends land in the mailbox. The exceptions are listed on
// [Table]: a Try never queues (and never overtakes: a key with waiters is
// never free), a waiter that gives up leaves the queue, and a grant that
// lands as its waiter gives up passes to the next waiter.
//
// Shared holders ([Shard.AcquireShared]) keep the order: a release admits
// waiters from the head of the queue while they fit, and stops at the
// first that does not, so a waiting writer is never overtaken by readers
// that came after it (see [Table], "Shared holders").
//
// # Abort during grant
//
// A caller gives up (context ended, timeout) at the moment the shard may be
// granting it. [Shard.Acquire] documents how that race always ends with the
// key either in the caller's hands or passed on, never leaked.
//
// # Inspection
//
// The table records, with every grant and every queued waiter, its
// caller's label and the time of the batch that made it (one clock reading
// per batch, given to the table by [Table.SetNow]: the table reads no clock
// itself). [Shard.Inspect] and [Shard.List] are messages like any other,
// answered in their turn from the table's state at that moment, never
// changing it; a List walks the table's entries in its own order under a
// budget, so a page costs a bounded amount whatever the table holds. A
// refused Try, and a waiter withdrawn after its timeout, learn the holder
// the table found from the reply they receive anyway ([Shard.AcquireWith]).
//
// # Verifying
//
// Build with -tags tenace_verify to run the table's invariant check after
// every message each shard applies (the parts a concurrent release by CAS
// cannot change mid-walk).
package shard
