package tenace

import (
	"reflect"
	"slices"
	"strings"

	"tenace.dev/tenace/internal/keyfmt"
)

// DeadlockError is returned, as *DeadlockError, by a Lock that would wait
// forever, and fn does not run:
//   - its execution already holds the key it asks for (a nested Lock step
//     on the same key and provider, a retry inside the lock). Locks are not
//     reentrant, so the wait could only end at its Timeout; the Lock answers
//     at once instead, on every provider, without asking the provider. Give
//     nested locks distinct keys.
//   - on a MemoryLockProvider, its wait closes a cycle of waits between
//     executions of the process (A holds k1 and waits for k2 while B holds
//     k2 and waits for k1; any number of keys, sets and shards): the wait
//     that closes the cycle is failed as it begins, and the others go on
//     once its execution releases what it holds. Cycle names the keys. Only
//     a Lock whose execution holds a key of the provider while it asks for
//     another takes part (see deadlock_cycle.go); a caller that holds
//     nothing pays nothing. Take keys in one order, or as one set
//     (LockOptions.Keys), and no cycle forms.
//
// The execution is the context a Lock gives its inner steps and every
// context derived from it: a goroutine started inside fn with fn's context
// counts as the same execution. What that context says it holds ends when
// the Lock releases: a context kept past it (context.WithoutCancel(ctx) for
// work that outlives the call) holds nothing through that Lock. Only locks taken through a Lock step are
// known this way; a lease a caller took from a provider directly is not. A
// cycle across processes (two executions holding keys of a distributed
// provider and each waiting for the other's) cannot be seen from one
// process: bound such waits with a Timeout.
type DeadlockError struct {
	// Key is the key asked for that the execution already holds.
	Key string
	// Cycle is the keys of the deadlock in the order of the waits: for an
	// execution asking for a key it holds, just Key.
	Cycle []string
}

// Error names the key and what to do about it.
func (e *DeadlockError) Error() string {
	if len(e.Cycle) > 1 {
		q := make([]string, len(e.Cycle))
		for i, k := range e.Cycle {
			q[i] = keyfmt.Quote(k)
		}
		return "tenace: deadlock: the waits for locks " + strings.Join(q, " → ") + " form a cycle that would never end; this waiter was failed to break it: take keys in one order, or as one set (LockOptions.Keys)"
	}
	return "tenace: deadlock: this execution already holds lock " + keyfmt.Quote(e.Key) + " (an enclosing Lock took it), and locks are not reentrant: waiting would never end; give nested locks distinct keys"
}

// heldKey is the context key under which a heldCtx finds itself.
type heldKey struct{}

// reentered returns the DeadlockError of a Lock that asks provider for key
// (keys, for a set) inside an execution that already holds one of them, or
// nil. It walks the Locks that enclose it: h, the nearest, and those
// around h.
func (h *heldCtx) reentered(provider LockProvider, key string, keys []string) *DeadlockError {
	for ; h != nil; h, _ = h.Context.Value(heldKey{}).(*heldCtx) {
		if h.released.Load() || !sameLocks(h.provider, provider) {
			continue
		}
		if k, ok := h.holds(key, keys); ok {
			return &DeadlockError{Key: k, Cycle: []string{k}}
		}
	}
	return nil
}

// holds reports whether h holds key (or one of keys, for a set), and which.
func (h *heldCtx) holds(key string, keys []string) (string, bool) {
	mine := h.heldKeys()
	if keys == nil {
		return key, slices.Contains(mine, key)
	}
	for _, k := range keys {
		if slices.Contains(mine, k) {
			return k, true
		}
	}
	return "", false
}

// heldKeys returns the keys h holds: its key, or its set's.
func (h *heldCtx) heldKeys() []string {
	if s, ok := h.lease.(*SetLease); ok {
		return s.Keys()
	}
	return []string{h.key}
}

// sameProvider reports whether a and b are the same provider. Providers are
// usually pointers; one whose type cannot be compared with == (a struct
// holding a slice, say) is never the same as another value, rather than a
// panic (nor is one that holds such a value in an interface field).
func sameProvider(a, b LockProvider) (same bool) {
	ta := reflect.TypeOf(a)
	if ta == nil || ta != reflect.TypeOf(b) || !ta.Comparable() {
		return false
	}
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}
