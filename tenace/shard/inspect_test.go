package shard

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// The table records who holds and who waits, at the time SetNow gave it,
// and Inspect shows it without changing a thing.
func TestTableInspectShowsHoldersAndWaiters(t *testing.T) {
	tb := NewTable[int]()
	a, b, c := &Waiter[int]{}, &Waiter[int]{}, &Waiter[int]{}
	a.SetLabel("job-a")
	b.SetLabel("job-b")
	b.SetShared(true, 0)
	tb.SetNow(10)
	require.True(t, tb.Acquire("k", a))
	tb.SetNow(20)
	require.False(t, tb.Acquire("k", b))
	tb.SetNow(30)
	require.False(t, tb.Acquire("k", c))

	v, ok := tb.Inspect("k", 1)
	require.True(t, ok)
	require.Equal(t, KeyView{
		Key:     "k",
		Holders: []HolderView{{Token: a.Token(), Label: "job-a", Since: 10}},
		Waiting: 2,
		Waiters: []WaiterView{{Label: "job-b", Since: 20, Shared: true}}, // one named, the oldest
	}, v)
	_, ok = tb.Inspect("other", 10)
	require.False(t, ok)
	require.NoError(t, tb.CheckInvariants())

	// a leaves: b holds it shared, granted at 40; c still waits.
	tb.SetNow(40)
	_, next := tb.Release("k", a.Token())
	require.Same(t, b, next)
	v, _ = tb.Inspect("k", 10)
	require.Equal(t, []HolderView{{Token: b.Token(), Label: "job-b", Since: 40, Shared: true}}, v.Holders)
	require.Equal(t, []WaiterView{{Since: 30}}, v.Waiters)
	require.NoError(t, tb.CheckInvariants())
}

// A refused try, and a waiter withdrawn from the queue, learn the holder
// they found: its label and grant time.
func TestTableReportsTheHolderToARefusalAndACancel(t *testing.T) {
	tb := NewTable[int]()
	a, b, c := &Waiter[int]{}, &Waiter[int]{}, &Waiter[int]{}
	a.SetLabel("api-7")
	tb.SetNow(5)
	require.True(t, tb.Acquire("k", a))
	tb.SetNow(9)
	c.SetLabel("mine")
	require.False(t, tb.TryAcquire("k", c))
	h, ok := c.Seen()
	require.True(t, ok)
	require.Equal(t, HolderView{Label: "api-7", Since: 5}, h)

	require.False(t, tb.Acquire("k", b))
	removed, _ := tb.Cancel(b)
	require.True(t, removed)
	h, ok = b.Seen()
	require.True(t, ok)
	require.Equal(t, HolderView{Label: "api-7", Since: 5}, h)

	// Shared holders: the oldest is named.
	r1, r2, w := &Waiter[int]{}, &Waiter[int]{}, &Waiter[int]{}
	r1.SetShared(true, 0)
	r2.SetShared(true, 0)
	r1.SetLabel("r1")
	r2.SetLabel("r2")
	tb.SetNow(11)
	require.True(t, tb.Acquire("s", r1))
	tb.SetNow(12)
	require.True(t, tb.Acquire("s", r2))
	require.False(t, tb.TryAcquire("s", w))
	h, ok = w.Seen()
	require.True(t, ok)
	require.Equal(t, HolderView{Label: "r1", Since: 11, Shared: true}, h)
	v, _ := tb.Inspect("s", 0)
	require.Len(t, v.Holders, 2)
	// r1 leaves: r2 is the only mark left.
	held := r1.Held()
	tb.ReleaseHeld(&held)
	v, _ = tb.Inspect("s", 0)
	require.Equal(t, []HolderView{{Token: r2.Token(), Label: "r2", Since: 12, Shared: true}}, v.Holders)
	require.NoError(t, tb.CheckInvariants())

	// A granted waiter saw nobody.
	_, ok = a.Seen()
	require.False(t, ok)
}

// List walks the table in its own order within a budget, and continuing
// from where it stopped covers every held key once.
func TestTableListPagesEveryHeldKeyOnce(t *testing.T) {
	tb := NewTable[int]()
	var want []string
	for i := range 50 {
		key := fmt.Sprintf("p/%02d", i)
		if i%5 == 0 {
			key = fmt.Sprintf("q/%02d", i) // another prefix
		} else {
			want = append(want, key)
		}
		require.True(t, tb.Acquire(key, &Waiter[int]{}))
	}
	var got []string
	pos := 0
	for pages := 0; pos >= 0; pages++ {
		require.Less(t, pages, 100)
		keys, next := tb.List("p/", pos, 7, 10, 0)
		require.LessOrEqual(t, len(keys), 7)
		for _, k := range keys {
			got = append(got, k.Key)
		}
		pos = next
	}
	slices.Sort(got)
	require.Equal(t, want, got)
}

// The shard answers a query in its turn, and a stopped group refuses one.
func TestShardInspectAndList(t *testing.T) {
	g := NewGroup(Options{Shards: 2})
	ctx := context.Background()
	r := &Request{Label: "me"}
	out, err := g.For("k").AcquireWith(ctx, "k", r, Wait, nil)
	require.NoError(t, err)
	require.True(t, out.Granted)
	v, ok, err := g.For("k").Inspect(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "me", v.Holders[0].Label)
	require.Equal(t, out.Token, v.Holders[0].Token)

	// A try finds the holder, with no message more.
	try := &Request{}
	out2, err := g.For("k").AcquireWith(ctx, "k", try, Try, nil)
	require.NoError(t, err)
	require.False(t, out2.Granted)
	require.True(t, try.HolderSeen)
	require.Equal(t, "me", try.Holder.Label)

	out.Grant().Release()
	_, ok, err = g.For("k").Inspect(ctx, "k", 10)
	require.NoError(t, err)
	require.False(t, ok)
	g.Stop()
	_, _, err = g.For("k").Inspect(ctx, "k", 10)
	require.ErrorIs(t, err, ErrStopped)
	_, _, err = g.Shard(0).List(ctx, "", 0, 10, 10, 0)
	require.ErrorIs(t, err, ErrStopped)
}

// A waiter used again forgets the holder its last request saw: drained,
// it reports none.
func TestTableSeenIsPerRequest(t *testing.T) {
	tb := NewTable[int]()
	a, w := &Waiter[int]{}, &Waiter[int]{}
	a.SetLabel("holder")
	require.True(t, tb.Acquire("k", a))
	require.False(t, tb.TryAcquire("k", w))
	_, ok := w.Seen()
	require.True(t, ok)
	require.False(t, tb.Acquire("k", w)) // used again: queued
	require.Len(t, tb.Drain(), 1)
	_, ok = w.Seen()
	require.False(t, ok, "drained: it found no holder")
}
