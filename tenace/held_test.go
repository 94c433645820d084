package tenace_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/provkit"
)

// TestHeldLeases: inside nested Locks, provkit.HeldLeases names the leases
// the execution holds from the provider asked about, innermost first, and
// none of another provider's; a context kept past its Lock holds nothing.
func TestHeldLeases(t *testing.T) {
	p, other := tenace.NewMemoryLockProvider(), tenace.NewMemoryLockProvider()
	t.Cleanup(func() { p.Close(); other.Close() })
	ctx := context.Background()
	require.Nil(t, provkit.HeldLeases(ctx, p))
	var kept context.Context
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "a"}).Execute(ctx, func(ctx context.Context) error {
		outer, _ := tenace.LeaseFrom(ctx)
		require.Equal(t, []any{outer}, provkit.HeldLeases(ctx, p))
		return tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: other, Key: "b"}).Execute(ctx, func(ctx context.Context) error {
			return tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "c"}).Execute(ctx, func(ctx context.Context) error {
				inner, _ := tenace.LeaseFrom(ctx)
				require.Equal(t, []any{inner, outer}, provkit.HeldLeases(ctx, p))
				require.Len(t, provkit.HeldLeases(ctx, other), 1)
				require.Nil(t, provkit.HeldLeases(ctx, "not a provider"))
				kept = ctx
				return nil
			})
		})
	})
	require.NoError(t, err)
	require.Nil(t, provkit.HeldLeases(kept, p))
}
