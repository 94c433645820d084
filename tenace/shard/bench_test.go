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
		out.Grant().Release() // the provider's lease is this Grant; see Grant
	}
}
