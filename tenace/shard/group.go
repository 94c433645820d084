package shard

import (
	"context"
	"math/bits"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Options configures a [Group]. The zero value is not valid: Shards must be
// at least 1.
type Options struct {
	// Shards is the number of shard goroutines; at least 1.
	Shards int
	// Mailbox is each shard's mailbox capacity; 0 means actor.DefaultMailbox.
	Mailbox int
	// OnQueued, if set, is called on the shard goroutine with the key of
	// each acquire that had to queue, after the batch that queued it was
	// applied and its size published. It lets tests know the arrival order
	// without sleeping. It must not block or call back into the group.
	OnQueued func(key string)
	// Go starts each shard goroutine; nil means a go statement.
	Go func(loop func())
}

// Group is N shards; each key belongs to one shard, chosen by its xxhash.
//
// Concurrency: a Group is safe for concurrent use. Its fields are set by
// NewGroup and never change; all lock state lives in the shards' tables,
// each owned by its shard goroutine.
type Group struct {
	opts   Options
	shards []*Shard
	n      uint64
	start  time.Time // the shards' clock counts from here (see Group.Time)
}

// NewGroup starts opts.Shards shard goroutines. It panics if opts.Shards < 1.
func NewGroup(opts Options) *Group {
	if opts.Shards < 1 {
		panic("tenace: shard.NewGroup: Shards must be at least 1")
	}
	g := &Group{opts: opts, n: uint64(opts.Shards), start: time.Now()}
	g.shards = make([]*Shard, opts.Shards)
	for i := range g.shards {
		g.shards[i] = newShard(g)
	}
	return g
}

// For returns the shard that owns key: xxhash.Sum64String(key) mapped onto
// [0, N) by a multiply-shift (Lemire's fast range reduction), which is as
// uniform as a modulo and cheaper than a division.
func (g *Group) For(key string) *Shard {
	if g.n == 1 {
		return g.shards[0]
	}
	hi, _ := bits.Mul64(xxhash.Sum64String(key), g.n)
	return g.shards[hi]
}

// Shards returns the number of shards.
func (g *Group) Shards() int { return len(g.shards) }

// Shard returns shard i, 0 ≤ i < Shards().
func (g *Group) Shard(i int) *Shard { return g.shards[i] }

// Size is the number of keys held or waited for over all shards: the sum of
// the shards' held counts. It is exact once every shard has applied every
// message sent to it (see Sync), and costs one atomic load per shard.
func (g *Group) Size() int {
	n := 0
	for _, s := range g.shards {
		n += s.Size()
	}
	return n
}

// Sync returns once every shard has applied every message sent to it before
// the call.
func (g *Group) Sync(ctx context.Context) error {
	for _, s := range g.shards {
		if err := s.Sync(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Stop stops every shard: each fails its queued waiters (their Acquire
// returns ErrStopped) and its goroutine exits before Stop returns — for
// every call, also one made while another is stopping the shards. Later
// calls of the shards' methods fail with ErrStopped. Stop is idempotent.
func (g *Group) Stop() {
	for _, s := range g.shards {
		s.mb.Stop()
	}
}
