//go:build !race

// Allocation budgets; see tenace/alloc_test.go for why not under -race.

package shard

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestUncontendedAcquireReleaseDoesNotAllocate pins the allocation budget of an uncontended
// acquire+release at the shard level: nothing at all.
func TestUncontendedAcquireReleaseDoesNotAllocate(t *testing.T) {
	g := NewGroup(Options{Shards: 1})
	defer g.Stop()
	s := g.For("k")
	allocs := testing.AllocsPerRun(1000, func() {
		out, _ := s.Acquire(context.Background(), "k", Wait, nil)
		s.Release("k", out.Token)
	})
	require.Zero(t, allocs)
}
