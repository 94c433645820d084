package shard

import (
	"slices"
	"sync"
)

// Mutation points. Each function below is the lock manager's correct rule
// at one point of the protocol, named for what it decides, so that table.go
// and shard.go read as the protocol alone. Under a tenace_mutant_<name> build tag (one file
// each, mutant_<name>.go) one of them breaks its rule on purpose, for
// package fuzz's mutation check (scripts/mutants): the fuzz targets must
// kill every mutant. In every normal build mutant is "" and each function is
// its first or last line, which the compiler inlines.

// nextHolder is the waiter a freed key passes to: the oldest.
// Mutant lifo: the newest.
func nextHolder[T any](e *entry[T]) *Waiter[T] {
	if mutant == "lifo" {
		return e.tail
	}
	return e.head
}

// refusesHeld reports that a try on a held key is refused.
// Mutant doublegrant: it is granted, and the key has two holders.
func refusesHeld() bool { return mutant != "doublegrant" }

// leavesQueue reports that a cancelled waiter leaves its queue.
// Mutant ghostwaiter: it stays queued, and is granted later to nobody.
func leavesQueue() bool { return mutant != "ghostwaiter" }

// passesOnRacedGrant reports that a grant its waiter gave up on passes on.
// Mutant leakcancel: it is kept, and the key leaks.
func passesOnRacedGrant() bool { return mutant != "leakcancel" }

// isCurrent reports whether word s is held by grant token.
// Mutant stalerelease: any held word is, so a stale token frees the holder.
func isCurrent(s, token uint64) bool {
	if s == stFree || s == stDead {
		return false
	}
	return tokenOfWord(s) == token || mutant == "stalerelease"
}

// releaseWord is the word a holder's CAS expects: held(token), so the CAS
// fails when waiters made it contended.
// Mutant casignoreswaiters: the word as it is, contended or not, so the CAS
// frees a key its waiters then wait for forever.
func releaseWord[T any](e *entry[T], token uint64) uint64 {
	if mutant == "casignoreswaiters" {
		if s := e.state.Load(); tokenOfWord(s) == token && s != stDead {
			return s
		}
	}
	return held(token)
}

// reclaimable reports whether Reap may delete e: only while it is free.
// Mutant idlekey: never, so idle keys stay in the table.
// Mutant reapheld: unless dead, so a key held again since its release by
// CAS loses its entry, and a new one grants it a second time.
func reclaimable[T any](e *entry[T]) bool {
	s := e.state.Load()
	switch mutant {
	case "idlekey":
		return false
	case "reapheld":
		return s != stDead
	}
	return s == stFree
}

// waiterPool is the pool s takes its idle waiters from and puts them back
// in: its own (see getWaiter).
// Mutant sharedpool: the first shard's, for every shard of the group, so a
// waiter pooled while its cancel is still on one shard's mailbox can be
// reused on another, and the stale cancel then withdraws it from that
// shard's table.
func waiterPool(s *Shard) *sync.Pool {
	if mutant == "sharedpool" {
		return &s.group.shards[0].waiters
	}
	return &s.waiters
}

// setOrder is the order AcquireAll takes a set's keys in: sorted, the one
// order of every caller (see Order).
// Mutant unordered: the caller's order, so two sets naming the same keys in
// different orders can each hold a key the other waits for, forever.
func setOrder(keys []string) []string {
	if mutant == "unordered" {
		return slices.Clone(keys)
	}
	return Order(keys)
}

// releaseGranted releases the keys a set was granted before it gave up,
// the last first.
// Mutant partialrelease: all but the first, which stays held by nobody.
func releaseGranted(grants []*Grant) {
	for i := len(grants) - 1; i >= 0; i-- {
		if mutant == "partialrelease" && i == 0 {
			break
		}
		grants[i].Release()
	}
}

// writerBesideReaders reports that a key held shared admits an exclusive
// waiter: never.
// Mutant writerbesidereader: it does, while a permit is free, so a writer
// holds the key beside its readers.
func writerBesideReaders() bool { return mutant == "writerbesidereader" }

// givesBackRacedPermit reports that a shared grant its waiter gave up on
// gives its permit back.
// Mutant leakpermit: it keeps it, and the key loses a permit for good.
func givesBackRacedPermit() bool { return mutant != "leakpermit" }
