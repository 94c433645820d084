//go:build !race

// Allocation budgets; see tenace/alloc_test.go for why not under -race.

package shard

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestUncontendedAcquireReleaseAllocatesNothing pins the allocation
// budget of an uncontended acquire+release at the shard level: nothing but
// the Grants' slabs (one allocation per grantSlab grants: a Grant is never
// reused, so that a second Release of it still names its own grant; the
// provider's lease is that Grant) — also on the message path.
func TestUncontendedAcquireReleaseAllocatesNothing(t *testing.T) {
	g := NewGroup(Options{Shards: 1})
	defer g.Stop()
	s := g.For("k")
	allocs := testing.AllocsPerRun(1000, func() {
		for range grantSlab / 2 {
			out, _ := s.Acquire(context.Background(), "k", Wait, nil)
			out.Grant().Release() // by CAS: nobody waits
			out, _ = s.Acquire(context.Background(), "k", Wait, nil)
			s.Release("k", out.Token) // by message
		}
	})
	// grantSlab grants a run: one slab.
	require.Equal(t, 1.0, allocs)
}
