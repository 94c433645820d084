// Package proptest holds the project's properties — state machines and
// reference models written with rapid — in one place, so that the unit tests
// run them with rapid.Check and package fuzz turns the same properties into
// native fuzz targets with rapid.MakeFuzz, instead of writing them twice.
package proptest

import (
	"slices"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"tenace.dev/tenace/shard"
)

// model is the reference the table is checked against: per key, a holder
// token (0: free) and a FIFO slice of waiting tokens. It is deliberately the
// most obvious implementation possible.
type model struct {
	holder map[string]uint64
	queue  map[string][]uint64
}

func newModel() *model {
	return &model{holder: map[string]uint64{}, queue: map[string][]uint64{}}
}

func (m *model) size() int { return len(m.holder) }

// tableMachine drives a Table[int] and the model with the same actions.
type tableMachine struct {
	t       *shard.Table[int]
	m       *model
	keys    []string
	waiters map[uint64]*shard.Waiter[int] // every waiter ever created, by token
	keyOf   map[uint64]string             // and the key each asked for
	last    uint64
}

// NewTableMachine returns a machine over keys, with an empty table and model;
// Actions lists its rapid actions, for rapid.T.Repeat.
func NewTableMachine(keys []string) *tableMachine {
	return &tableMachine{t: shard.NewTable[int](), m: newModel(), keys: keys, waiters: map[uint64]*shard.Waiter[int]{}, keyOf: map[uint64]string{}}
}

func (tm *tableMachine) record(rt *rapid.T, key string, w *shard.Waiter[int]) {
	if w.Token() <= tm.last {
		rt.Fatalf("token %d after %d: tokens must only go up", w.Token(), tm.last)
	}
	tm.last = w.Token()
	tm.waiters[w.Token()] = w
	tm.keyOf[w.Token()] = key
}

func (tm *tableMachine) Acquire(rt *rapid.T) {
	key := rapid.SampledFrom(tm.keys).Draw(rt, "key")
	w := &shard.Waiter[int]{}
	granted := tm.t.Acquire(key, w)
	tm.record(rt, key, w)
	if tm.m.holder[key] == 0 {
		require.True(rt, granted, "a free key is granted at once")
		require.Equal(rt, shard.Granted, w.State())
		tm.m.holder[key] = w.Token()
	} else {
		require.False(rt, granted, "a held key queues")
		require.Equal(rt, shard.Queued, w.State())
		tm.m.queue[key] = append(tm.m.queue[key], w.Token())
	}
}

func (tm *tableMachine) TryAcquire(rt *rapid.T) {
	key := rapid.SampledFrom(tm.keys).Draw(rt, "key")
	w := &shard.Waiter[int]{}
	granted := tm.t.TryAcquire(key, w)
	tm.record(rt, key, w)
	if tm.m.holder[key] == 0 {
		require.True(rt, granted)
		tm.m.holder[key] = w.Token()
	} else {
		require.False(rt, granted, "a try never queues nor overtakes")
		require.Equal(rt, shard.Refused, w.State())
	}
}

// grantNext is the model's release: the oldest waiter, if any, holds next.
func (tm *tableMachine) grantNext(key string) uint64 {
	q := tm.m.queue[key]
	if len(q) == 0 {
		delete(tm.m.holder, key)
		delete(tm.m.queue, key)
		return 0
	}
	tm.m.holder[key], tm.m.queue[key] = q[0], q[1:]
	return q[0]
}

func tokenOf(w *shard.Waiter[int]) uint64 {
	if w == nil {
		return 0
	}
	return w.Token()
}

// heldKey draws a held key; ok is false when none is held, and the action
// then does nothing (see providerMachine.heldKey).
func (tm *tableMachine) heldKey(rt *rapid.T) (key string, ok bool) {
	var held []string
	for _, k := range tm.keys {
		if tm.m.holder[k] != 0 {
			held = append(held, k)
		}
	}
	if len(held) == 0 {
		return "", false
	}
	return rapid.SampledFrom(held).Draw(rt, "held key"), true
}

func (tm *tableMachine) Release(rt *rapid.T) {
	key, ok := tm.heldKey(rt)
	if !ok {
		return
	}
	released, next := tm.t.Release(key, tm.m.holder[key])
	require.True(rt, released)
	want := tm.grantNext(key)
	require.Equal(rt, want, tokenOf(next), "the oldest waiter is granted next")
	if next != nil {
		require.Equal(rt, shard.Granted, next.State())
	}
}

// ReleaseByCAS is the holder's own release, as a lease makes it: one
// compare-and-swap, which frees the key only when nobody waits; otherwise
// it fails, and the release goes to the table as a message (Release).
func (tm *tableMachine) ReleaseByCAS(rt *rapid.T) {
	key, ok := tm.heldKey(rt)
	if !ok {
		return
	}
	h := tm.waiters[tm.m.holder[key]].Held()
	released, _ := tm.t.ReleaseByCAS(&h)
	if len(tm.m.queue[key]) == 0 {
		require.True(rt, released, "nobody waits: the CAS frees the key")
		tm.grantNext(key)
		require.Equal(rt, tm.m.size(), tm.t.Len(), "Len drops at once, before any reap")
		return
	}
	require.False(rt, released, "a CAS must not free a key with waiters")
	ok, next := tm.t.ReleaseHeld(&h)
	require.True(rt, ok)
	require.Equal(rt, tm.grantNext(key), tokenOf(next), "the release message grants the oldest waiter")
}

// ReleaseByCASStale retries the CAS of a grant that already ended: it
// changes nothing, whoever holds the key now.
func (tm *tableMachine) ReleaseByCASStale(rt *rapid.T) {
	var ended []uint64
	for token, w := range tm.waiters {
		if w.State() == shard.Granted && tm.m.holder[tm.keyOf[token]] != token {
			ended = append(ended, token)
		}
	}
	if len(ended) == 0 {
		return // nothing to do: a no-op step, not a skip (see heldKey)
	}
	slices.Sort(ended)
	h := tm.waiters[rapid.SampledFrom(ended).Draw(rt, "ended grant")].Held()
	released, _ := tm.t.ReleaseByCAS(&h)
	require.False(rt, released, "a stale grant's CAS frees nothing")
	released, next := tm.t.ReleaseHeld(&h)
	require.False(rt, released, "nor does its release message")
	require.Nil(rt, next)
}

// Reap is the owner's batch-time cleanup: every key freed by CAS loses its
// entry, and nothing held or waited for does.
func (tm *tableMachine) Reap(rt *rapid.T) {
	tm.t.Reap()
	require.Equal(rt, tm.m.size(), tm.t.Entries(), "after a reap, an entry per key held, no more")
}

// Tidy is the owner's after-batch housekeeping: it sweeps exactly when the
// sweep is due (enough free entries, and as many as held), and leaves it
// not due.
func (tm *tableMachine) Tidy(rt *rapid.T) {
	due := tm.t.ReapDue()
	before := tm.t.Entries()
	tm.t.Tidy()
	if due {
		require.Equal(rt, tm.m.size(), tm.t.Entries(), "a due sweep leaves an entry per key held, no more")
	} else {
		require.Equal(rt, before, tm.t.Entries(), "no sweep when none is due")
	}
	require.False(rt, tm.t.ReapDue(), "after Tidy no sweep is due")
}

func (tm *tableMachine) ReleaseStale(rt *rapid.T) {
	if len(tm.waiters) == 0 {
		return // nothing to do: a no-op step, not a skip (see heldKey)
	}
	key := rapid.SampledFrom(tm.keys).Draw(rt, "key")
	token := rapid.Uint64Range(0, tm.last+1).Draw(rt, "stale token")
	if token == tm.m.holder[key] {
		return // nothing to do: a no-op step, not a skip (see heldKey)
	}
	released, next := tm.t.Release(key, token)
	require.False(rt, released, "a stale token releases nothing")
	require.Nil(rt, next)
}

func (tm *tableMachine) CancelQueued(rt *rapid.T) {
	var queued []uint64
	for _, k := range tm.keys {
		queued = append(queued, tm.m.queue[k]...)
	}
	if len(queued) == 0 {
		return // nothing to do: a no-op step, not a skip (see heldKey)
	}
	token := rapid.SampledFrom(queued).Draw(rt, "queued token")
	w := tm.waiters[token]
	removed, next := tm.t.Cancel(w)
	require.True(rt, removed)
	require.Nil(rt, next, "cancelling a waiter grants nobody")
	require.Equal(rt, shard.Cancelled, w.State())
	tm.m.queue[tm.keyOf[token]] = slices.DeleteFunc(tm.m.queue[tm.keyOf[token]], func(t uint64) bool { return t == token })
}

// CancelGranted is the abort during grant: the waiter gave up after the
// table granted it; the grant passes on.
func (tm *tableMachine) CancelGranted(rt *rapid.T) {
	key, ok := tm.heldKey(rt)
	if !ok {
		return
	}
	w := tm.waiters[tm.m.holder[key]]
	removed, next := tm.t.Cancel(w)
	require.False(rt, removed)
	require.Equal(rt, tm.grantNext(key), tokenOf(next), "the grant passes to the oldest waiter")
}

// CancelStale cancels a waiter that is neither queued nor holding.
func (tm *tableMachine) CancelStale(rt *rapid.T) {
	var stale []uint64
	for token, w := range tm.waiters {
		if w.State() != shard.Queued && tm.m.holder[tm.keyOf[token]] != token {
			stale = append(stale, token)
		}
	}
	if len(stale) == 0 {
		return // nothing to do: a no-op step, not a skip (see heldKey)
	}
	slices.Sort(stale)
	w := tm.waiters[rapid.SampledFrom(stale).Draw(rt, "stale waiter")]
	before := w.State()
	removed, next := tm.t.Cancel(w)
	require.False(rt, removed)
	require.Nil(rt, next)
	require.Equal(rt, before, w.State())
}

// Check runs after every action: the table's own invariants, and the table
// agreeing with the model on size, holders and queue order.
func (tm *tableMachine) Check(rt *rapid.T) {
	require.NoError(rt, tm.t.CheckInvariants())
	require.Equal(rt, tm.m.size(), tm.t.Len(), "size: keys held or waited for")
	require.GreaterOrEqual(rt, tm.t.Entries(), tm.t.Len(), "every key held has its entry")
	waiting, longest := 0, 0
	for _, k := range tm.keys {
		holder, held := tm.t.Holder(k)
		require.Equal(rt, tm.m.holder[k] != 0, held, "key %q held", k)
		require.Equal(rt, tm.m.holder[k], holder, "key %q holder", k)
		want := tm.m.queue[k]
		if len(want) == 0 {
			want = nil
		}
		require.Equal(rt, want, tm.t.Queue(k), "key %q queue, in arrival order", k)
		waiting += len(want)
		longest = max(longest, len(want))
	}
	require.Equal(rt, waiting, tm.t.Waiting())
	require.Equal(rt, longest, tm.t.Longest(), "the longest queue")
}

// Actions are the machine's named actions for rapid.T.Repeat; "" checks
// the invariants after every step.
func (tm *tableMachine) Actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"acquire":           tm.Acquire,
		"try":               tm.TryAcquire,
		"release":           tm.Release,
		"release-cas":       tm.ReleaseByCAS,
		"release-cas-stale": tm.ReleaseByCASStale,
		"reap":              tm.Reap,
		"tidy":              tm.Tidy,
		"release-stale":     tm.ReleaseStale,
		"cancel-queued":     tm.CancelQueued,
		"cancel-granted":    tm.CancelGranted,
		"cancel-stale":      tm.CancelStale,
		"":                  tm.Check,
	}
}

// TableProperty is the table state-machine property: any sequence of
// acquires, tries, releases (by message and by CAS, current and stale
// grants), reaps and cancels (queued, granted, stale) keeps the invariants
// and agrees with the FIFO model; at the end, releasing every holder in turn
// and reaping empties the table.
func TableProperty(rt *rapid.T) {
	tm := NewTableMachine([]string{"a", "b", "c"})
	rt.Repeat(tm.Actions())
	for _, k := range tm.keys {
		for tm.m.holder[k] != 0 {
			h := tm.waiters[tm.m.holder[k]].Held()
			if released, _ := tm.t.ReleaseByCAS(&h); released {
				tm.grantNext(k)
				continue
			}
			_, next := tm.t.ReleaseHeld(&h)
			require.Equal(rt, tm.grantNext(k), tokenOf(next))
		}
	}
	require.Zero(rt, tm.t.Len(), "an idle table holds nothing")
	tm.t.Reap()
	require.Zero(rt, tm.t.Entries(), "an idle, reaped table keeps no entry")
	require.NoError(rt, tm.t.CheckInvariants())
}
