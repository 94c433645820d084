package tenace_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// generic hides a provider's AcquireSet, so that AcquireAll takes the
// generic path, as it does for redislock, pglock and etcdlock.
type generic struct{ tenace.LockProvider }

// providers are the two paths of AcquireAll on the memory provider.
func setProviders(t *testing.T) map[string]tenace.LockProvider {
	p := tenace.NewMemoryLockProvider(tenace.WithShards(3))
	t.Cleanup(func() { p.Close() })
	return map[string]tenace.LockProvider{"memory": p, "generic": generic{p}}
}

// requireGivenBack checks that each key can be had at once, and gives it
// back: a set that gave up holds none of its keys. It also makes Size exact
// for them: the shards apply a key's messages in order, so the withdrawals
// and releases sent before on these keys have been applied (Size may count
// a withdrawal not yet applied).
func requireGivenBack(t *testing.T, p tenace.LockProvider, keys ...string) {
	t.Helper()
	for _, k := range keys {
		l, err := p.Acquire(context.Background(), k, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(t, err)
		require.NotNil(t, l, "%q is still held", k)
		require.NoError(t, l.Release(context.Background()))
	}
}

func size(p tenace.LockProvider) int {
	if g, ok := p.(generic); ok {
		p = g.LockProvider
	}
	return p.(*tenace.MemoryLockProvider).Size()
}

func TestAcquireAllBadInput(t *testing.T) {
	for name, p := range setProviders(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			for _, keys := range [][]string{nil, {}, {"a", ""}} {
				l, err := tenace.AcquireAll(ctx, p, keys, tenace.LockAcquireOptions{})
				require.ErrorIs(t, err, tenace.ErrMissingKey, "%q", keys)
				require.Nil(t, l)
			}
			l, err := tenace.AcquireAll(ctx, p, []string{"a", "b", "a"}, tenace.LockAcquireOptions{})
			require.ErrorIs(t, err, tenace.ErrInvalidOption)
			require.ErrorContains(t, err, `names "a" twice`)
			require.Nil(t, l)
			_, err = tenace.AcquireAll(ctx, p, []string{"a"}, tenace.LockAcquireOptions{Timeout: -2})
			require.ErrorIs(t, err, tenace.ErrInvalidOption)
			require.Zero(t, size(p))
		})
	}
}

// A set is taken exclusive, whatever path AcquireAll takes: Shared or
// Permits is an option error, through a one-method wrapper (the generic
// path, whose provider would take each key shared) as on the provider, and
// nothing is asked for. The messages name the key that is empty.
func TestAcquireAllRefusesASharedSet(t *testing.T) {
	for name, p := range setProviders(t) {
		t.Run(name, func(t *testing.T) {
			for _, opts := range []tenace.LockAcquireOptions{{Shared: true}, {Shared: true, Permits: 2}, {Permits: 2}} {
				l, err := tenace.AcquireAll(bg, p, []string{"a", "b"}, opts)
				require.ErrorIs(t, err, tenace.ErrInvalidOption, "%+v", opts)
				require.ErrorContains(t, err, "a set of keys is taken exclusive")
				require.Nil(t, l)
				require.Zero(t, size(p))
			}
			_, err := tenace.AcquireAll(bg, p, []string{"a", ""}, tenace.LockAcquireOptions{})
			require.ErrorIs(t, err, tenace.ErrMissingKey)
			require.ErrorContains(t, err, "keys[1] of the set is empty")
		})
	}
}

// A set is granted all or none: while one of its keys is held, it takes
// none of them — neither on a timeout, nor with NoWait, nor when its ctx
// ends — and once the key is free, it takes them all.
func TestAcquireAllAllOrNothing(t *testing.T) {
	for name, p := range setProviders(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			// "m" sorts between the others: the set holds "a" while it waits
			// for "m", and must give "a" back.
			// NoWait: the subtests share the provider, and one that failed
			// holding m must not leave the next waiting for it for ever.
			blocker, err := p.Acquire(ctx, "m", tenace.LockAcquireOptions{Timeout: tenace.NoWait})
			require.NoError(t, err)
			require.NotNil(t, blocker, "m is free at the start")
			for _, opts := range []tenace.LockAcquireOptions{{Timeout: tenace.NoWait}, {Timeout: 20 * time.Millisecond}} {
				l, err := tenace.AcquireAll(ctx, p, []string{"z", "m", "a"}, opts)
				require.NoError(t, err)
				require.Nil(t, l, "not granted while m is held")
				requireGivenBack(t, p, "a", "z")
				require.Equal(t, 1, size(p), "only m is held")
			}
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				l, err := tenace.AcquireAll(cctx, p, []string{"z", "m", "a"}, tenace.LockAcquireOptions{})
				if l != nil {
					err = errors.New("granted")
				}
				done <- err
			}()
			require.Eventually(t, func() bool { return size(p) == 2 }, 10*time.Second, time.Millisecond, "the set holds a and waits for m")
			cancel()
			require.ErrorIs(t, <-done, context.Canceled)
			requireGivenBack(t, p, "a", "z")
			require.Equal(t, 1, size(p), "a was given back")

			require.NoError(t, blocker.Release(ctx))
			l, err := tenace.AcquireAll(ctx, p, []string{"z", "m", "a"}, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
			require.NoError(t, err)
			require.NotNil(t, l)
			require.Equal(t, []string{"a", "m", "z"}, l.Keys(), "acquired in sorted order")
			require.Equal(t, 3, size(p))
			for i, k := range l.Keys() {
				f, ok := l.Leases()[i].(tenace.FencedLease)
				require.True(t, ok, "one fencing token per key")
				require.NotZero(t, f.Token(), k)
			}
			require.Nil(t, l.Lost(), "memory leases are never lost")
			require.NoError(t, l.Release(ctx))
			require.NoError(t, l.Release(ctx), "a second Release does nothing")
			require.Zero(t, size(p))
		})
	}
}

// Two callers naming the same keys in opposite orders, again and again,
// never wait for each other forever.
func TestAcquireAllOppositeOrders(t *testing.T) {
	for name, p := range setProviders(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			orders := [][]string{{"a", "b", "c"}, {"c", "b", "a"}}
			errc := make(chan error, len(orders))
			for _, keys := range orders {
				go func() {
					for range 2000 {
						l, err := tenace.AcquireAll(ctx, p, keys, tenace.LockAcquireOptions{})
						if err != nil {
							errc <- err // a deadlock ends in the minute's ctx
							return
						}
						_ = l.Release(ctx)
					}
					errc <- nil
				}()
			}
			for range orders {
				require.NoError(t, <-errc)
			}
			require.Zero(t, size(p))
		})
	}
}

// A Lock with Keys holds the set around fn; events name the set; LeaseFrom
// returns the *SetLease.
func TestLockKeys(t *testing.T) {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	var rec recorder
	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Keys: []string{"to", "from"}}).OnEvent(rec.on)
	err := pol.Execute(context.Background(), func(ctx context.Context) error {
		l, ok := tenace.LeaseFrom(ctx)
		require.True(t, ok)
		set, ok := l.(*tenace.SetLease)
		require.True(t, ok)
		require.Equal(t, []string{"from", "to"}, set.Keys())
		require.Equal(t, 2, p.Size())
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"lock.acquiring:from,to", "lock.acquired:from,to", "lock.released:from,to"}, rec.names())
	require.Zero(t, p.Size())

	blocker, err := p.Acquire(context.Background(), "to", tenace.LockAcquireOptions{})
	require.NoError(t, err)
	defer blocker.Release(context.Background())
	err = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Keys: []string{"to", "from"}, Timeout: tenace.NoWait}).Execute(context.Background(), func(context.Context) error { return nil })
	var na *tenace.LockNotAcquiredError
	require.ErrorAs(t, err, &na)
	require.Equal(t, "from,to", na.Key)

	for _, opts := range []tenace.LockOptions{
		{Provider: p, Key: "a", Keys: []string{"b"}},
		{Provider: p, Keys: []string{"b", "b"}},
	} {
		err := tenace.NewPolicy().WithLock(opts).Execute(context.Background(), func(context.Context) error { return nil })
		require.ErrorIs(t, err, tenace.ErrInvalidOption, "%+v", opts)
	}
	err = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Keys: []string{"b", ""}}).Execute(context.Background(), func(context.Context) error { return nil })
	require.ErrorIs(t, err, tenace.ErrMissingKey)
	require.Equal(t, 1, p.Size(), "only the key held by hand")
}
