package shard

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
)

// idleRounds runs 100 rounds, each in a synctest bubble: g goroutines (2 to
// 8) each call work(s, gi) against one real shard with a tiny mailbox (1 to
// 4 slots, so reap requests get dropped); once they all returned,
// synctest.Wait parks until the shard goroutine is durably blocked on its
// empty mailbox — the shard is idle — and idle(s) checks it.
func idleRounds(t *testing.T, work func(s *Shard, gi int), idle func(t *testing.T, s *Shard)) {
	for round := range 100 {
		synctest.Test(t, func(t *testing.T) {
			grp := NewGroup(Options{Shards: 1, Mailbox: 1 + round%4})
			defer grp.Stop()
			s := grp.Shard(0)
			var wg sync.WaitGroup
			for gi := range 2 + round%7 {
				wg.Go(func() { work(s, gi) })
			}
			wg.Wait()
			synctest.Wait()
			idle(t, s)
		})
	}
}

// acquireOrPanic acquires key on s, from a goroutine other than the test's.
func acquireOrPanic(s *Shard, key string) *Grant {
	out, err := s.Acquire(context.Background(), key, Wait, nil)
	if err != nil || !out.Granted {
		panic("not granted")
	}
	return out.Grant()
}

// requireNoSweepDue checks an idle shard: no sweep is due.
func requireNoSweepDue(t *testing.T, s *Shard) {
	t.Helper()
	held, mapped := s.table.heldKeys.Load(), s.table.mapped.Load()
	require.False(t, reapDue(mapped, held), "idle shard left with %d entries, %d held", mapped, held)
}

// Goroutines acquire and release distinct and shared keys; the idle shard
// is not left with a sweep due. (From the review of the sweep.)
func TestAnIdleShardIsNeverLeftWithASweepDue(t *testing.T) {
	idleRounds(t, func(s *Shard, gi int) {
		for i := range 200 {
			key := fmt.Sprint("g", gi, "k", i)
			if i%5 == 0 {
				key = fmt.Sprint("shared", i%3)
			}
			acquireOrPanic(s, key).Release()
		}
	}, func(t *testing.T, s *Shard) {
		require.Zero(t, s.table.heldKeys.Load())
		requireNoSweepDue(t, s)
	})
}

// The same with some leases kept to the end, then released: neither idle
// state is left with a sweep due, and the last leaves fewer than reapDepth
// entries.
func TestAnIdleShardWithKeptLeasesIsNeverLeftWithASweepDue(t *testing.T) {
	var mu sync.Mutex // the test's own bookkeeping, not the shard's
	var kept []*Grant
	idleRounds(t, func(s *Shard, gi int) {
		for i := range 300 {
			g := acquireOrPanic(s, fmt.Sprint("g", gi, "k", i))
			if (i*7+gi)%11 != 0 {
				g.Release()
				continue
			}
			mu.Lock()
			kept = append(kept, g)
			mu.Unlock()
		}
	}, func(t *testing.T, s *Shard) {
		requireNoSweepDue(t, s)
		for _, g := range kept {
			g.Release()
		}
		kept = nil
		synctest.Wait()
		requireNoSweepDue(t, s)
		require.Less(t, s.table.mapped.Load(), int64(reapDepth))
	})
}

// The idle bound is max(reapDepth, held) free entries, not reapDepth: with
// keys still held and no traffic, fewer free entries than held ones stay.
// (The review found the doc said less.)
func TestAnIdleTableHoldingKeysKeepsFewerFreeEntriesThanItHolds(t *testing.T) {
	tb := NewTable[int]()
	hs := grantKeys(t, tb, "k", 200)
	for _, h := range hs[:99] {
		_, reap := tb.ReleaseByCAS(h)
		require.False(t, reap)
	}
	owner{tb}.batch()
	require.Equal(t, 99, tb.Entries()-tb.Len(), "99 free entries kept by an idle table holding 101 keys")
}
