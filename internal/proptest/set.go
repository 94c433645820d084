package proptest

import (
	"context"
	"fmt"
	"slices"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"tenace.dev/tenace"
)

// scall is one AcquireAll running on its own goroutine.
type scall struct {
	id       int
	keys     []string // in the caller's order
	kind     callKind
	cancel   context.CancelFunc
	deadline time.Time // for withTimeout
	lease    *tenace.SetLease
}

func (c *scall) String() string { return fmt.Sprintf("#%d(%v %s)", c.id, c.keys, c.kind) }

type sresult struct {
	c     *scall
	lease *tenace.SetLease
	err   error
}

// genericProvider hides the memory provider's AcquireSet, so that
// AcquireAll takes its generic path (keys one by one in sorted order).
type genericProvider struct{ tenace.LockProvider }

// setMachine drives sets of keys through tenace.AcquireAll on a
// MemoryLockProvider (its AcquireSet, or the generic path), from goroutines
// drawn by rapid, in a testing/synctest bubble. Which of two sets woken by
// one release takes a key they both want next is up to the scheduler, so
// the machine does not predict every grant, as providerMachine does for
// single keys; it checks what holds whatever the scheduler does:
//   - mutual exclusion: a set is granted only keys no granted set holds;
//   - all or nothing: a set that gives up (NoWait, timeout, cancel) gets no
//     lease, and, once no set is waiting, Size counts exactly the keys of
//     the granted sets — nothing a give-up took is left held;
//   - progress: with nobody waiting, a set of free keys is granted at once;
//     a set waiting without a bound is granted once the granted sets are
//     released (a deadlock between sets is reported as such);
//   - a NoWait set with a held key is refused at once; a timeout returns
//     at its deadline, not granted; a cancel returns ctx's error.
type setMachine struct {
	p       *tenace.MemoryLockProvider
	acq     tenace.LockProvider // p, or p behind genericProvider
	results chan sresult
	keys    []string
	pending []*scall // waiting, no result yet
	granted []*scall // granted, not released
	calls   int
}

// settle waits until the bubble is idle and applies the results that came:
// each must be for a pending call; a grant must not overlap a granted set.
func (m *setMachine) settle(rt *rapid.T) map[*scall]sresult {
	synctest.Wait()
	got := map[*scall]sresult{}
	for {
		select {
		case r := <-m.results:
			if !slices.Contains(m.pending, r.c) {
				rt.Fatalf("unexpected result for %v", r.c)
			}
			m.pending = slices.DeleteFunc(m.pending, func(c *scall) bool { return c == r.c })
			got[r.c] = r
			if r.lease == nil {
				continue
			}
			require.NoError(rt, r.err, "%v", r.c)
			require.ElementsMatch(rt, r.c.keys, r.lease.Keys(), "%v: the lease holds the set", r.c)
			require.True(rt, slices.IsSorted(r.lease.Keys()), "%v: the keys were acquired in sorted order, not %v", r.c, r.lease.Keys())
			for _, k := range r.c.keys {
				if h := m.holder(k); h != nil {
					rt.Fatalf("%v granted while %v holds %q", r.c, h, k)
				}
			}
			r.c.lease = r.lease
			m.granted = append(m.granted, r.c)
		default:
			return got
		}
	}
}

func (m *setMachine) holder(key string) *scall {
	for _, c := range m.granted {
		if slices.Contains(c.keys, key) {
			return c
		}
	}
	return nil
}

func (m *setMachine) Acquire(rt *rapid.T) {
	n := rapid.IntRange(1, min(3, len(m.keys))).Draw(rt, "set size")
	keys := rapid.Permutation(m.keys).Draw(rt, "keys")[:n]
	m.launch(rt, keys, callKind(rapid.IntRange(0, 3).Draw(rt, "kind")))
}

// launch starts an AcquireAll of keys and settles: a set of free keys,
// with nobody waiting, is granted at once; a NoWait set returns at once.
func (m *setMachine) launch(rt *rapid.T, keys []string, kind callKind) *scall {
	m.calls++
	c := &scall{id: m.calls, keys: keys, kind: kind}
	ctx := context.Background()
	var opts tenace.LockAcquireOptions
	switch c.kind {
	case withTimeout:
		d := time.Duration(rapid.IntRange(1, 50).Draw(rt, "timeout s")) * time.Second
		opts.Timeout, c.deadline = d, time.Now().Add(d)
	case cancellable:
		ctx, c.cancel = context.WithCancel(ctx)
	case noWait:
		opts.Timeout = tenace.NoWait
	}
	free := len(m.pending) == 0 && !slices.ContainsFunc(keys, func(k string) bool { return m.holder(k) != nil })
	m.pending = append(m.pending, c)
	go func() {
		l, err := tenace.AcquireAll(ctx, m.acq, keys, opts)
		m.results <- sresult{c, l, err}
	}()
	got := m.settle(rt)
	r, returned := got[c]
	switch {
	case free:
		require.True(rt, returned && r.lease != nil, "%v: free keys, nobody waiting: granted at once", c)
	case c.kind == noWait:
		require.True(rt, returned, "%v: NoWait returns at once", c)
		require.NoError(rt, r.err)
		if r.lease == nil {
			require.True(rt, slices.ContainsFunc(keys, func(k string) bool { return m.holder(k) != nil }) || len(m.pending) > 0,
				"%v: refused though its keys are free and nobody waits", c)
		}
	}
	return c
}

// GiveUpHoldingPart: with nobody waiting, a set of a free key and a held
// one that sorts after it (held first by a set of its own if it is free)
// takes the free key, waits for the held one, and gives up (NoWait, cancel
// or timeout): it must give the free key back (Check then finds Size
// exact).
func (m *setMachine) GiveUpHoldingPart(rt *rapid.T) {
	if len(m.pending) > 0 {
		return // a no-op step, not a skip (see providerMachine.heldKey)
	}
	var pairs [][2]string
	for _, f := range m.keys {
		for _, h := range m.keys {
			if f < h && m.holder(f) == nil {
				pairs = append(pairs, [2]string{f, h})
			}
		}
	}
	if len(pairs) == 0 {
		return
	}
	pair := rapid.SampledFrom(pairs).Draw(rt, "free and held")
	if m.holder(pair[1]) == nil {
		m.launch(rt, pair[1:], waitForever) // granted at once: nobody waits
	}
	c := m.launch(rt, []string{pair[1], pair[0]}, rapid.SampledFrom([]callKind{noWait, cancellable, withTimeout}).Draw(rt, "give-up"))
	switch c.kind {
	case cancellable:
		m.Cancel(rt)
	case withTimeout:
		m.Timeout(rt)
	}
	require.NotContains(rt, m.pending, c, "%v gave up", c)
}

// Crossing: with nothing held, a set holds two keys while two more sets
// wait for them, naming them in opposite orders; released, the two must
// each be granted in turn, never waiting for each other forever.
func (m *setMachine) Crossing(rt *rapid.T) {
	if len(m.pending) > 0 || len(m.granted) > 0 {
		return // a no-op step, not a skip (see providerMachine.heldKey)
	}
	xy := rapid.Permutation(m.keys).Draw(rt, "crossing keys")[:2]
	m.launch(rt, xy, waitForever)
	m.launch(rt, xy, waitForever)
	m.launch(rt, []string{xy[1], xy[0]}, waitForever)
	for range 3 {
		if len(m.granted) != 1 {
			rt.Fatalf("deadlock: %v wait for %q in opposite orders, and %d sets are granted", m.pending, xy, len(m.granted))
		}
		c := m.granted[0]
		m.granted = m.granted[1:]
		require.NoError(rt, c.lease.Release(context.Background()))
		m.settle(rt)
	}
}

// Release releases a granted set, which may let waiting sets through.
func (m *setMachine) Release(rt *rapid.T) {
	if len(m.granted) == 0 {
		return // a no-op step, not a skip (see providerMachine.heldKey)
	}
	c := rapid.SampledFrom(m.granted).Draw(rt, "release")
	m.granted = slices.DeleteFunc(m.granted, func(x *scall) bool { return x == c })
	require.NoError(rt, c.lease.Release(context.Background()))
	m.settle(rt)
	require.NoError(rt, c.lease.Release(context.Background()), "a second Release")
	m.settle(rt)
}

func (m *setMachine) pendingOf(kind callKind) []*scall {
	return slices.DeleteFunc(slices.Clone(m.pending), func(c *scall) bool { return c.kind != kind })
}

// Cancel cancels a waiting set: it returns ctx's error, and what it held
// is released (checked by Check once nobody waits, and by the drain).
func (m *setMachine) Cancel(rt *rapid.T) {
	cs := m.pendingOf(cancellable)
	if len(cs) == 0 {
		return
	}
	c := rapid.SampledFrom(cs).Draw(rt, "cancel")
	c.cancel()
	r, ok := m.settle(rt)[c]
	require.True(rt, ok, "%v: a cancel returns", c)
	require.ErrorIs(rt, r.err, context.Canceled)
	require.Nil(rt, r.lease)
}

// Timeout runs the bubble's clock to the earliest waiting deadline: every
// set due by then returns, not granted.
func (m *setMachine) Timeout(rt *rapid.T) {
	cs := m.pendingOf(withTimeout)
	if len(cs) == 0 {
		return
	}
	slices.SortFunc(cs, func(a, b *scall) int { return a.deadline.Compare(b.deadline) })
	time.Sleep(time.Until(cs[0].deadline))
	got := m.settle(rt)
	for _, c := range cs {
		if c.deadline.After(time.Now()) {
			continue
		}
		r, ok := got[c]
		require.True(rt, ok, "%v: its timeout passed, it returns", c)
		require.NoError(rt, r.err)
		require.Nil(rt, r.lease, "%v timed out", c)
	}
}

// Check runs after every action: no result the machine did not expect, and
// once nobody waits, Size is exactly the keys of the granted sets.
func (m *setMachine) Check(rt *rapid.T) {
	m.settle(rt)
	held := 0
	for _, c := range m.granted {
		held += len(c.keys)
	}
	if len(m.pending) == 0 {
		require.Equal(rt, held, m.p.Size(), "nobody waits: the keys of the granted sets are held, nothing else")
		require.Equal(rt, tenace.LockStats{Held: held}, m.p.Stats())
	} else {
		require.GreaterOrEqual(rt, m.p.Size(), held)
	}
}

// drain releases, cancels and times out until nobody waits: a set waiting
// without a bound while no set is granted is a deadlock. Then nothing may
// be left held, and every key can be taken at once.
func (m *setMachine) drain(rt *rapid.T) {
	for len(m.pending) > 0 || len(m.granted) > 0 {
		switch {
		case len(m.granted) > 0:
			c := m.granted[0]
			m.granted = m.granted[1:]
			require.NoError(rt, c.lease.Release(context.Background()))
			m.settle(rt)
		case len(m.pendingOf(cancellable)) > 0:
			c := m.pendingOf(cancellable)[0]
			c.cancel()
			m.settle(rt)
		case len(m.pendingOf(withTimeout)) > 0:
			m.Timeout(rt)
		default:
			rt.Fatalf("deadlock: %v wait, and no set is granted", m.pending)
		}
	}
	require.Zero(rt, m.p.Size(), "no key left held or waited for")
	for _, k := range m.keys {
		l, err := m.p.Acquire(context.Background(), k, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(rt, err)
		require.NotNil(rt, l, "key %q leaked", k)
		require.NoError(rt, l.Release(context.Background()))
	}
}

// SetProperty: goroutines drawn by rapid acquire sets of one to three keys,
// named in random orders, and hold, release, time out and cancel them (see
// setMachine for what it checks), on the memory provider's AcquireSet or on
// AcquireAll's generic path. It must run inside a testing/synctest bubble;
// it makes its provider there.
func SetProperty(rt *rapid.T) {
	m := &setMachine{
		results: make(chan sresult, 1024),
		keys:    []string{"a", "b", "c", "d"}[:rapid.IntRange(2, 4).Draw(rt, "keys")],
	}
	shards, generic := rapid.IntRange(1, 3).Draw(rt, "shards"), rapid.Bool().Draw(rt, "generic")
	// No draw between here and the defer: a draw that fails (a fuzz input
	// too short) would leave the shards running.
	m.p = tenace.NewMemoryLockProvider(tenace.WithShards(shards))
	m.acq = m.p
	if generic {
		m.acq = genericProvider{m.p}
	}
	defer func() {
		require.NoError(rt, m.p.Close())
		synctest.Wait() // every caller has returned
	}()
	rt.Repeat(map[string]func(*rapid.T){
		"acquire": m.Acquire,
		"release": m.Release,
		"cancel":  m.Cancel,
		"timeout": m.Timeout,
		"give-up": m.GiveUpHoldingPart,
		"cross":   m.Crossing,
		"":        m.Check,
	})
	m.drain(rt)
}
