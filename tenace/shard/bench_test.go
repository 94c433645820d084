package shard

import (
	"context"
	"testing"
)

// BenchmarkShardAcquireRelease is one uncontended acquire+release at the
// shard level, without the tenace layer (validation, the lease): the cost of
// the shard protocol itself, to set beside bench's Floor/actor.
func BenchmarkShardAcquireRelease(b *testing.B) {
	g := NewGroup(Options{Shards: 1})
	defer g.Stop()
	s := g.For("k")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		out, _ := s.Acquire(ctx, "k", Wait, nil)
		held := new(Grant) // as the provider's lease keeps it; see Grant
		*held = out.Grant(s)
		held.Release()
	}
}
