package tenace_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

func TestTokenFromIsTheNearestLocksToken(t *testing.T) {
	p, _ := newProvider(t)
	_, ok := tenace.TokenFrom(bg)
	require.False(t, ok, "no lease outside a Lock")

	var acquired []uint64 // the tokens of the acquired events, outer first
	var inner, outer uint64
	pol := tenace.NewPolicy().
		With(tenace.NewLock(tenace.LockOptions{Provider: p, Key: "inner"})).
		With(tenace.NewLock(tenace.LockOptions{Provider: p, Key: "outer"})).
		OnEvent(func(e tenace.Event) {
			if e.Name == tenace.EventLockAcquired {
				acquired = append(acquired, e.Token)
			}
		})
	// Raise outer's token above inner's, so that the two differ.
	for range 3 {
		l, err := p.Acquire(bg, "outer", tenace.LockAcquireOptions{})
		require.NoError(t, err)
		require.NoError(t, l.Release(bg))
	}
	require.NoError(t, pol.Execute(bg, func(ctx context.Context) error {
		var ok bool
		inner, ok = tenace.TokenFrom(ctx)
		require.True(t, ok)
		return nil
	}))
	require.NoError(t, tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "outer"}).Execute(bg, func(ctx context.Context) error {
		outer, _ = tenace.TokenFrom(ctx)
		return nil
	}))
	require.Len(t, acquired, 2)
	require.NotEqual(t, acquired[0], acquired[1])
	require.Equal(t, acquired[1], inner, "the innermost Lock's token")
	require.Greater(t, outer, acquired[0], "a later grant of outer has a higher token")
}

func TestTokenFromALeaseWithoutATokenIsFalse(t *testing.T) {
	fp := &fakeProvider{} // its leases are not FencedLeases
	require.NoError(t, tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: fp, Key: "k"}).Execute(bg, func(ctx context.Context) error {
		_, leased := tenace.LeaseFrom(ctx)
		require.True(t, leased)
		tok, ok := tenace.TokenFrom(ctx)
		require.False(t, ok)
		require.Zero(t, tok)
		return nil
	}))
}
