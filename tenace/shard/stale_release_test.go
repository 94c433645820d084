package shard

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// A Grant has no released flag: a second Release, or a stale one long after
// its key was swept, its entry recycled for another key and granted again,
// must find its grant no longer current and change nothing. Sixteen
// goroutines over 300 keys (a few hot, the rest swept and recycled), plain
// and concurrent double releases, stale releases of old Grants fired while
// others hold keys: mutual exclusion holds, the held count comes back to
// zero, and so after the group stopped. (It fails by the thousands with the
// stalerelease mutant.)
func TestStaleAndDoubleReleasesChangeNothing(t *testing.T) {
	g := NewGroup(Options{Shards: 2, Mailbox: 8})
	const keys = 300 // > reapDepth and spareMax-ish, so entries are swept and recycled
	inUse := make([]atomic.Int32, keys)
	var staleMu sync.Mutex
	var stale []*Grant
	var violations atomic.Int64
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 1))
			for range 2000 {
				// Few hot keys for contention, many cold ones for sweeping.
				k := r.IntN(keys)
				if r.IntN(2) == 0 {
					k = r.IntN(3)
				}
				key := fmt.Sprint("k", k)
				mode := Wait
				if r.IntN(5) == 0 {
					mode = Try
				}
				out, err := g.For(key).Acquire(context.Background(), key, mode, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if !out.Granted {
					continue
				}
				if inUse[k].Add(1) != 1 {
					violations.Add(1)
				}
				// Fire stale releases of other grants while holding.
				for range r.IntN(3) {
					staleMu.Lock()
					var old *Grant
					if len(stale) > 0 {
						old = stale[r.IntN(len(stale))]
					}
					staleMu.Unlock()
					if old != nil {
						old.Release()
					}
				}
				if r.IntN(4) == 0 {
					runtime.Gosched() // let others reach the key meanwhile
				}
				if inUse[k].Load() != 1 {
					violations.Add(1)
				}
				inUse[k].Add(-1)
				gr := out.Grant()
				switch r.IntN(3) {
				case 0: // plain double release
					gr.Release()
					gr.Release()
				case 1: // concurrent double release
					var w2 sync.WaitGroup
					w2.Add(2)
					go func() { defer w2.Done(); gr.Release() }()
					go func() { defer w2.Done(); gr.Release() }()
					w2.Wait()
				default:
					gr.Release()
				}
				staleMu.Lock()
				if len(stale) < 4096 {
					stale = append(stale, gr)
				} else {
					stale[r.IntN(len(stale))] = gr
				}
				staleMu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Zero(t, violations.Load(), "a stale release let two holders in")
	require.NoError(t, g.Sync(context.Background()))
	require.Zero(t, g.Size())
	for i := range g.Shards() {
		require.NoError(t, g.Shard(i).table.CheckInvariants())
	}
	// Every stale grant released once more, with the group running.
	for _, gr := range stale {
		gr.Release()
	}
	require.NoError(t, g.Sync(context.Background()))
	require.Zero(t, g.Size())
	// Hold some keys, stop, then release everything (stale and current) twice.
	held := holdKeys(t, g, 10)
	require.Equal(t, 10, g.Size())
	g.Stop()
	require.Zero(t, g.Size(), "drain uncounts the held keys")
	for _, gr := range append(held, stale...) {
		gr.Release()
		gr.Release()
	}
	require.Zero(t, g.Size())
}

// Two Releases of each held key race the group's Stop: nothing is counted
// twice, nothing blocks.
func TestDoubleReleasesRacingStopChangeNothing(t *testing.T) {
	for range 200 {
		g := NewGroup(Options{Shards: 1})
		grants := holdKeys(t, g, 20)
		var wg sync.WaitGroup
		for _, gr := range grants {
			wg.Add(2)
			go func() { defer wg.Done(); gr.Release() }()
			go func() { defer wg.Done(); gr.Release() }()
		}
		g.Stop()
		wg.Wait()
		require.Zero(t, g.Size())
	}
}

// holdKeys acquires keys k0 … k(n-1) on g and returns their Grants.
func holdKeys(t *testing.T, g *Group, n int) []*Grant {
	t.Helper()
	var held []*Grant
	for k := range n {
		key := fmt.Sprint("k", k)
		held = append(held, grantOf(t, g.For(key), key))
	}
	return held
}
