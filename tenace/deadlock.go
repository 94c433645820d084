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
//   - on a provider with a DeadlockDetector (MemoryLockProvider; see
//     DeadlockDetectingProvider), its wait closes a cycle of waits between
//     executions of the process (A holds k1 and waits for k2 while B holds
//     k2 and waits for k1; any number of keys, sets and shards): the wait
//     that closes the cycle is failed as it begins, and the others go on
//     once its execution releases what it holds. Cycle names the keys. Only
//     a wait that holds something takes part — a Lock whose execution holds
//     a key of the provider, or a set holding the keys it was granted while
//     it waits for the next (see deadlock_cycle.go); a caller that holds
//     nothing pays nothing, and a NoWait try, which never waits, is not
//     granted rather than failed. Take keys in one order, or as one set
//     (LockOptions.Keys), and no cycle forms.
//   - a provider's own Acquire returned it (a server that found a cycle).
//
// The execution is the context a Lock gives its inner steps and every
// context derived from it: a goroutine started inside fn with fn's context
// counts as the same execution. What that context says it holds ends when
// the Lock releases: a context kept past it (context.WithoutCancel(ctx) for
// work that outlives the call) holds nothing through that Lock. Only locks
// taken through a Lock step are known this way; a lease a caller took from
// a provider directly is not. A cycle across processes cannot be seen from
// one process unless the server detects it: bound such waits with a
// Timeout.
//
// Through a Lock its event is EventLockDeadlock.
type DeadlockError struct {
	// Key is the key asked for that the execution already holds, or the
	// first key of Cycle.
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
		return "tenace: deadlock: this wait closes the cycle of waits " + strings.Join(q, " → ") + "; take keys in one order, or as one set (LockOptions.Keys)"
	}
	return "tenace: deadlock: this execution already holds lock " + keyfmt.Quote(e.Key) + " and locks are not reentrant; give nested locks distinct keys"
}

// lockCtxKey is the context key under which a lockCtx finds itself.
type lockCtxKey struct{}

// reentered returns the DeadlockError of a Lock that asks provider for key
// (keys, for a set) inside an execution that already holds one of them, or
// nil. It walks the Locks that enclose it: h, the nearest, and those
// around h.
func (h *lockCtx) reentered(provider LockProvider, key string, keys []string) *DeadlockError {
	for ; h != nil; h, _ = h.Context.Value(lockCtxKey{}).(*lockCtx) {
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
func (h *lockCtx) holds(key string, keys []string) (string, bool) {
	mine := h.keys()
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

// keys returns the keys h holds: its key, or its set's.
func (h *lockCtx) keys() []string {
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
