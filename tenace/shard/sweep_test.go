package shard

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
)

// Many goroutines acquire and release distinct and shared keys through a
// real shard with a tiny mailbox (so reap requests get dropped). Once every
// goroutine returned, synctest.Wait parks until the shard goroutine is
// durably blocked on its empty mailbox: the shard is idle, and must not be
// left with a sweep due. (From the review of the sweep.)
func TestAnIdleShardIsNeverLeftWithASweepDue(t *testing.T) {
	for iter := range 100 {
		mailbox := 1 + iter%4
		g := 2 + iter%7
		synctest.Test(t, func(t *testing.T) {
			grp := NewGroup(Options{Shards: 1, Mailbox: mailbox})
			s := grp.Shard(0)
			var wg sync.WaitGroup
			for gi := range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 200 {
						key := fmt.Sprint("g", gi, "k", i)
						if i%5 == 0 {
							key = fmt.Sprint("shared", i%3)
						}
						out, err := s.Acquire(context.Background(), key, Wait, nil)
						if err != nil || !out.Granted {
							panic("not granted")
						}
						out.Grant().Release()
					}
				}()
			}
			wg.Wait()
			synctest.Wait() // shard goroutine durably blocked: idle
			held, mapped := s.table.held.Load(), s.table.mapped.Load()
			require.Zero(t, held)
			require.False(t, reapDue(mapped, held), "iter %d: idle shard stranded with %d entries, %d held", iter, mapped, held)
			grp.Stop()
		})
	}
}

// The same with some leases kept to the end, then released: neither idle
// state is left with a sweep due, and the last leaves fewer than reapDepth
// entries.
func TestAnIdleShardWithKeptLeasesIsNeverLeftWithASweepDue(t *testing.T) {
	for iter := range 100 {
		mailbox := 1 + iter%3
		g := 2 + iter%5
		synctest.Test(t, func(t *testing.T) {
			grp := NewGroup(Options{Shards: 1, Mailbox: mailbox})
			s := grp.Shard(0)
			var wg sync.WaitGroup
			kept := make([][]*Grant, g)
			for gi := range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 300 {
						key := fmt.Sprint("g", gi, "k", i)
						out, err := s.Acquire(context.Background(), key, Wait, nil)
						if err != nil || !out.Granted {
							panic("not granted")
						}
						if (i*7+gi)%11 == 0 {
							kept[gi] = append(kept[gi], out.Grant())
						} else {
							out.Grant().Release()
						}
					}
				}()
			}
			wg.Wait()
			synctest.Wait()
			held, mapped := s.table.held.Load(), s.table.mapped.Load()
			require.False(t, reapDue(mapped, held), "iter %d: idle shard stranded: %d entries, %d held", iter, mapped, held)
			for _, ks := range kept {
				for _, k := range ks {
					k.Release()
				}
			}
			synctest.Wait()
			held, mapped = s.table.held.Load(), s.table.mapped.Load()
			require.False(t, reapDue(mapped, held), "iter %d after kept released: %d entries, %d held", iter, mapped, held)
			require.Less(t, mapped, int64(reapDepth))
			grp.Stop()
		})
	}
}

// The idle bound is max(reapDepth, held) free entries, not reapDepth: with
// keys still held and no traffic, fewer free entries than held ones stay.
// (The review found the doc said less.)
func TestAnIdleTableHoldingKeysKeepsFewerFreeEntriesThanItHolds(t *testing.T) {
	tb := NewTable[int]()
	var hs []*Held[int]
	for i := range 200 {
		hs = append(hs, grantKey(t, tb, fmt.Sprint("k", i)))
	}
	for _, h := range hs[:99] {
		_, reap := tb.ReleaseByCAS(h)
		require.False(t, reap)
	}
	owner{tb}.batch()
	require.Equal(t, 99, tb.Entries()-tb.Len(), "99 free entries kept by an idle table holding 101 keys")
}
