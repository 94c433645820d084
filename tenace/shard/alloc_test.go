//go:build !race

// Allocation budgets; see tenace/alloc_test.go for why not under -race.

package shard

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestUncontendedAcquireReleaseAllocatesOnlyTheGrant pins the allocation
// budget of an uncontended acquire+release at the shard level: the Grant
// kept until the release (a released Grant may sit on the reclaim stack, so
// it is never reused; the provider's lease is that allocation), and nothing
// else — also on the message path.
func TestUncontendedAcquireReleaseAllocatesOnlyTheGrant(t *testing.T) {
	g := NewGroup(Options{Shards: 1})
	defer g.Stop()
	s := g.For("k")
	allocs := testing.AllocsPerRun(1000, func() {
		out, _ := s.Acquire(context.Background(), "k", Wait, nil)
		held := new(Grant)
		*held = out.Grant(s)
		held.Release() // by CAS: nobody waits
		out, _ = s.Acquire(context.Background(), "k", Wait, nil)
		s.Release("k", out.Token) // by message
	})
	require.Equal(t, 1.0, allocs)
}
