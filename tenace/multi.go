package tenace

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	tclock "tenace.dev/tenace/clock"
	"tenace.dev/tenace/internal/keyfmt"
)

// MultiLockProvider is the optional interface of a provider that grants a
// set of keys itself, better than one key after another in a global order
// (one round trip, one timer for the set). AcquireAll uses it when a
// provider implements it, and otherwise acquires the keys one by one in
// sorted order, which works on every LockProvider.
//
// AcquireSet gets keys that AcquireAll has checked with ValidateKeys: at
// least one, none empty, no duplicates, in the caller's order. It must grant
// all of them or none, and must not deadlock against other callers of
// AcquireSet that name the same keys in another order (acquire in an order
// of its own, the same for every caller). It returns what Acquire does: a
// lease (NewSetLease, its keys in the order acquired) when all are granted;
// (nil, nil) when not all were granted within opts.Timeout, which bounds
// the whole set; (nil, err) with ctx's error when ctx ended first, or the
// provider's own error. Whenever it returns no lease, none of the keys may
// be left held.
type MultiLockProvider interface {
	LockProvider
	AcquireSet(ctx context.Context, keys []string, opts LockAcquireOptions) (*SetLease, error)
}

// SetLease is the grant of a set of keys, all held together: it holds one
// lease per key, each with the key's own fencing token when the provider's
// leases are FencedLeases (Leases; there is no single token for the set,
// since a resource fences each key on its own). Release releases them all.
//
// It is a LosableLease: Lost is closed, with the first loss as Err, as soon
// as the lease of any key is lost (a distributed provider's); with leases
// that are never lost (MemoryLockProvider's) Lost returns nil, a channel
// that is never closed.
type SetLease struct {
	keys    []string
	leases  []LockLease
	lost    LeaseSignal
	stop    chan struct{} // closed by the first Release; nil without losable parts
	stopped atomic.Bool   // the first Release has closed stop (used once, never looped on)
}

var _ LosableLease = (*SetLease)(nil)

// NewSetLease returns the lease of a set, for provider authors: keys[i] is
// held by leases[i], keys in the order they were acquired. It panics if the
// lengths differ or a lease is nil. When some leases are LosableLeases it
// starts one goroutine for each, which ends at Release.
func NewSetLease(keys []string, leases []LockLease) *SetLease {
	if len(keys) != len(leases) || slices.Contains(leases, nil) {
		panic("tenace: NewSetLease: one non-nil lease per key is needed")
	}
	s := &SetLease{keys: keys, leases: leases}
	for _, l := range leases {
		ll, ok := l.(LosableLease)
		if !ok {
			continue
		}
		if s.stop == nil {
			s.stop = make(chan struct{})
		}
		go func() {
			select {
			case <-ll.Lost():
				s.lost.Lose(ll.Err())
			case <-s.stop:
			}
		}()
	}
	return s
}

// Keys returns the keys of the set, in the order they were acquired. The
// caller must not change the slice.
func (s *SetLease) Keys() []string { return s.keys }

// Leases returns the lease of each key, in the order of Keys. The caller
// must not change the slice, nor release its leases one by one.
func (s *SetLease) Leases() []LockLease { return s.leases }

// Release releases every key of the set, the last acquired first, and
// returns the errors of the releases that failed, joined. A second call
// does what a second Release of each lease does: nothing.
func (s *SetLease) Release(ctx context.Context) error {
	if s.stop != nil && s.stopped.CompareAndSwap(false, true) {
		close(s.stop) // once, also when two Releases run at once
	}
	return releaseAll(ctx, s.leases)
}

// Lost returns a channel closed when the lease of any key of the set is
// lost; nil when none of them can be.
func (s *SetLease) Lost() <-chan struct{} {
	if s.stop == nil {
		return nil
	}
	return s.lost.Lost()
}

// Err is nil until a key's lease is lost, then that lease's error.
func (s *SetLease) Err() error { return s.lost.Err() }

// releaseAll releases leases, the last first, and joins their errors.
func releaseAll(ctx context.Context, leases []LockLease) error {
	var errs []error
	for i := len(leases) - 1; i >= 0; i-- {
		if err := leases[i].Release(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ValidateKeys checks the keys of a set, for provider authors: an error
// wrapping ErrMissingKey for an empty set or an empty key (naming its
// index), an error wrapping ErrInvalidOption, naming the key, for a key
// named twice, and nil otherwise. ValidateSet checks the options too.
func ValidateKeys(keys []string) error {
	if len(keys) == 0 {
		return errEmptySet
	}
	if i := slices.Index(keys, ""); i >= 0 {
		return emptySetKeyError(i)
	}
	// A map only for large sets: for a few keys, comparing each with those
	// before it is cheaper than hashing them.
	var seen map[string]bool
	if len(keys) > 16 {
		seen = make(map[string]bool, len(keys))
	}
	for i, k := range keys {
		dup := false
		if seen != nil {
			dup, seen[k] = seen[k], true
		} else {
			dup = slices.Contains(keys[:i], k)
		}
		if dup {
			return fmt.Errorf("%w: the set of keys names %s twice; name each key once", ErrInvalidOption, keyfmt.Quote(k))
		}
	}
	return nil
}

// errEmptySet is ValidateKeys's error for a set of no keys.
var errEmptySet error = setKeyError{msg: "tenace: the set of keys is empty: name at least one key"}

// emptySetKeyError is ValidateKeys's error for an empty key: i is its index.
func emptySetKeyError(i int) error {
	return setKeyError{msg: "tenace: keys[" + strconv.Itoa(i) + "] of the set is empty; name every key of the set"}
}

// setKeyError is a set's missing key: errors.Is(err, ErrMissingKey) holds,
// and the message says which.
type setKeyError struct{ msg string }

func (e setKeyError) Error() string        { return e.msg }
func (e setKeyError) Is(target error) bool { return target == ErrMissingKey }

// AcquireAll acquires every key of keys from p, all or none, and returns
// their lease.
//
// It returns what a LockProvider's Acquire returns, for the whole set: a
// lease when every key is granted; (nil, nil) when not all were granted
// within opts.Timeout, which bounds the whole set (NoWait: each key is
// tried once); (nil, ctx's error) when ctx ended first; (nil, err) when the
// provider failed; ErrMissingKey or an error wrapping ErrInvalidOption for
// bad input (see ValidateSet), whatever p is: a shared set is refused here,
// also from a provider that would take its keys shared one by one. Whenever it returns no
// lease, none of the keys is held: what was granted before the give-up is
// released before it returns (on the memory provider, in the same instant as
// a single key's give-up).
//
// Deadlock-free: when p is a MultiLockProvider, AcquireSet does the work;
// otherwise the keys are acquired one at a time in sorted (byte) order, the
// one order every caller uses, so that two callers naming the same keys in
// different orders never wait for each other forever. With a Timeout, each
// key gets what is left of it (a key reached once it has passed is tried
// once, as with NoWait), so the set takes at most the Timeout plus one try.
//
// FIFO holds per key: a set waits in each key's queue as a single caller
// would. A set does not hold a key it has not been granted yet, but holds
// the ones it was granted while it waits for the next, as any ordered
// acquire does.
func AcquireAll(ctx context.Context, p LockProvider, keys []string, opts LockAcquireOptions) (*SetLease, error) {
	if err := ValidateSet(keys, opts); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return acquireSet(ctx, p, keys, opts)
}

// acquireSet is AcquireAll once keys and opts are valid.
func acquireSet(ctx context.Context, p LockProvider, keys []string, opts LockAcquireOptions) (*SetLease, error) {
	if mp, ok := p.(MultiLockProvider); ok {
		return mp.AcquireSet(ctx, keys, opts)
	}
	return acquireInOrder(ctx, p, slices.Sorted(slices.Values(keys)), opts, nil)
}

// acquireInOrder is AcquireAll's generic path: keys one at a time, in the
// order given, releasing what was granted on any failure, give-up or panic.
// before, when not nil, is called before each key with the number of keys
// granted so far, and returns the context to acquire that key with (see
// cycleWatch.before); nil acquires every key with ctx.
func acquireInOrder(ctx context.Context, p LockProvider, keys []string, opts LockAcquireOptions, before func(granted int) context.Context) (lease *SetLease, err error) {
	leases := make([]LockLease, 0, len(keys))
	defer func() {
		if lease == nil {
			// A release gets the ctx's values but not its end (see Lock).
			_ = releaseAll(context.WithoutCancel(ctx), leases)
		}
	}()
	clock := opts.Clock
	if clock == nil {
		clock = tclock.System()
	}
	var end time.Time
	if opts.Timeout > 0 {
		end = clock.Now().Add(opts.Timeout)
	}
	for i, key := range keys {
		o := opts
		if opts.Timeout > 0 {
			if o.Timeout = end.Sub(clock.Now()); o.Timeout <= 0 {
				o.Timeout = NoWait
			}
		}
		actx := ctx
		if before != nil {
			actx = before(i)
		}
		l, err := p.Acquire(actx, key, o)
		if err != nil || l == nil {
			if l != nil {
				leases = append(leases, l) // against the contract: given back
			}
			return nil, err
		}
		leases = append(leases, l)
	}
	return NewSetLease(keys, leases), nil
}

// setName is how events and errors name a set: its keys sorted, joined by
// commas ("a,b,c"). A key that itself holds a comma makes the name
// ambiguous; SetLease.Keys is exact.
func setName(keys []string) string {
	return strings.Join(slices.Sorted(slices.Values(keys)), ",")
}
