package proptest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"tenace.dev/tenace"
)

type callKind int

const (
	waitForever callKind = iota
	withTimeout
	cancellable
	noWait
)

func (k callKind) String() string {
	return [...]string{"wait", "timeout", "cancellable", "nowait"}[k]
}

// pcall is one Acquire running on its own goroutine.
type pcall struct {
	id       int
	key      string
	kind     callKind
	cancel   context.CancelFunc
	deadline time.Time // for withTimeout
	lease    tenace.LockLease
}

func (c *pcall) String() string { return fmt.Sprintf("#%d(%s %s)", c.id, c.key, c.kind) }

type outcome struct {
	c     *pcall
	lease tenace.LockLease
	err   error
}

// providerMachine drives a MemoryLockProvider from drawn actions and keeps
// the obvious model beside it: per key, a holder and a FIFO queue. Every
// Acquire runs on its own goroutine. The machine runs inside a
// testing/synctest bubble: after each action, synctest.Wait returns once
// every goroutine — the shards and every caller — is blocked, so the
// machine knows exactly which calls have returned and which are queued, with
// no hook and no sleep, and timeouts run on the bubble's fake clock.
type providerMachine struct {
	p       *tenace.MemoryLockProvider
	results chan outcome
	keys    []string
	holder  map[string]*pcall
	queue   map[string][]*pcall
	calls   int
}

// settle waits until everything in the bubble is blocked, then returns the
// results that arrived meanwhile.
func (m *providerMachine) settle() []outcome {
	synctest.Wait()
	var out []outcome
	for {
		select {
		case o := <-m.results:
			out = append(out, o)
		default:
			return out
		}
	}
}

// expect settles and requires exactly the results of cs, in any order.
func (m *providerMachine) expect(rt *rapid.T, cs ...*pcall) map[*pcall]outcome {
	got := m.settle()
	byCall := map[*pcall]outcome{}
	for _, o := range got {
		if !slices.Contains(cs, o.c) {
			rt.Fatalf("unexpected result for %v (lease %v, err %v); expected results for %v", o.c, o.lease != nil, o.err, cs)
		}
		byCall[o.c] = o
	}
	for _, c := range cs {
		if _, ok := byCall[c]; !ok {
			rt.Fatalf("no result for %v: it should have returned", c)
		}
	}
	return byCall
}

func (m *providerMachine) Acquire(rt *rapid.T) {
	m.calls++
	c := &pcall{id: m.calls, key: rapid.SampledFrom(m.keys).Draw(rt, "key"), kind: callKind(rapid.IntRange(0, 3).Draw(rt, "kind"))}
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
	go func() {
		l, err := m.p.Acquire(ctx, c.key, opts)
		m.results <- outcome{c, l, err}
	}()
	switch {
	case m.holder[c.key] == nil:
		o := m.expect(rt, c)[c]
		require.NoError(rt, o.err)
		require.NotNil(rt, o.lease, "%v: a free key is granted at once", c)
		c.lease, m.holder[c.key] = o.lease, c
	case c.kind == noWait:
		o := m.expect(rt, c)[c]
		require.NoError(rt, o.err)
		require.Nil(rt, o.lease, "%v: NoWait on a held key", c)
	default:
		m.expect(rt) // queued: no result yet
		m.queue[c.key] = append(m.queue[c.key], c)
	}
}

// handOn is the model's release of key: its oldest waiter must be granted,
// and nobody else.
func (m *providerMachine) handOn(rt *rapid.T, key string) {
	q := m.queue[key]
	if len(q) == 0 {
		delete(m.holder, key)
		m.expect(rt)
		return
	}
	next := q[0]
	m.queue[key] = q[1:]
	o := m.expect(rt, next)[next]
	require.NoError(rt, o.err)
	require.NotNil(rt, o.lease, "%v: the oldest waiter is granted", next)
	next.lease, m.holder[key] = o.lease, next
}

// heldKey draws a held key; ok is false when none is held, and the action
// then does nothing (a skipped action would make rapid's Repeat give up on
// inputs that keep drawing it, which fuzzing finds at once).
func (m *providerMachine) heldKey(rt *rapid.T) (key string, ok bool) {
	var held []string
	for _, k := range m.keys {
		if m.holder[k] != nil {
			held = append(held, k)
		}
	}
	if len(held) == 0 {
		return "", false
	}
	return rapid.SampledFrom(held).Draw(rt, "held key"), true
}

func (m *providerMachine) Release(rt *rapid.T) {
	key, ok := m.heldKey(rt)
	if !ok {
		return
	}
	require.NoError(rt, m.holder[key].lease.Release(context.Background()))
	if len(m.queue[key]) == 0 {
		// Released by CAS: Size drops before the shard runs at all.
		require.Equal(rt, len(m.holder)-1, m.p.Size(), "Size right after a release nobody waited for")
	}
	m.handOn(rt, key)
}

// RaceReleaseAndAcquire releases a key nobody waits for while a new acquire
// of it is on its way to the shard: the release by CAS and the shard's
// marking the key contended race, and either way the newcomer is granted,
// once, and nobody else.
func (m *providerMachine) RaceReleaseAndAcquire(rt *rapid.T) {
	var keys []string
	for _, k := range m.keys {
		if m.holder[k] != nil && len(m.queue[k]) == 0 {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return // nothing to do: a no-op step, not a skip (see heldKey)
	}
	key := rapid.SampledFrom(keys).Draw(rt, "race key")
	m.calls++
	c := &pcall{id: m.calls, key: key, kind: waitForever}
	go func() {
		l, err := m.p.Acquire(context.Background(), key, tenace.LockAcquireOptions{})
		m.results <- outcome{c, l, err}
	}()
	require.NoError(rt, m.holder[key].lease.Release(context.Background()))
	o := m.expect(rt, c)[c]
	require.NoError(rt, o.err)
	require.NotNil(rt, o.lease, "%v: the key was released, the newcomer is granted", c)
	c.lease, m.holder[key] = o.lease, c
}

// ReleaseTwice releases a lease that was already released: nothing happens,
// in particular the key's current holder keeps it.
func (m *providerMachine) ReleaseTwice(rt *rapid.T) {
	key, ok := m.heldKey(rt)
	if !ok {
		return
	}
	old := m.holder[key]
	require.NoError(rt, old.lease.Release(context.Background()))
	m.handOn(rt, key)
	require.NoError(rt, old.lease.Release(context.Background()))
	m.expect(rt)
}

func (m *providerMachine) queuedOf(kind callKind) []*pcall {
	var out []*pcall
	for _, k := range m.keys {
		for _, c := range m.queue[k] {
			if c.kind == kind {
				out = append(out, c)
			}
		}
	}
	return out
}

func (m *providerMachine) remove(c *pcall) {
	m.queue[c.key] = slices.DeleteFunc(m.queue[c.key], func(x *pcall) bool { return x == c })
}

func (m *providerMachine) Cancel(rt *rapid.T) {
	cs := m.queuedOf(cancellable)
	if len(cs) == 0 {
		return // nothing to do: a no-op step, not a skip (see heldKey)
	}
	c := rapid.SampledFrom(cs).Draw(rt, "cancel")
	c.cancel()
	o := m.expect(rt, c)[c]
	require.ErrorIs(rt, o.err, context.Canceled)
	require.Nil(rt, o.lease)
	m.remove(c)
}

// Timeout lets the bubble's clock run to the earliest waiting deadline:
// every waiter due by then times out, and nobody else returns.
func (m *providerMachine) Timeout(rt *rapid.T) {
	cs := m.queuedOf(withTimeout)
	if len(cs) == 0 {
		return // nothing to do: a no-op step, not a skip (see heldKey)
	}
	slices.SortFunc(cs, func(a, b *pcall) int { return a.deadline.Compare(b.deadline) })
	time.Sleep(time.Until(cs[0].deadline))
	var due []*pcall
	for _, c := range cs {
		if !c.deadline.After(time.Now()) {
			due = append(due, c)
		}
	}
	for c, o := range m.expect(rt, due...) {
		require.NoError(rt, o.err)
		require.Nil(rt, o.lease, "%v timed out", c)
		m.remove(c)
	}
}

// RaceReleaseAndCancel is the abort during grant: the holder releases while
// the oldest waiter's context is cancelled. Either the waiter gets the lease,
// or it reports ctx's error and the grant passes to the waiter behind it.
func (m *providerMachine) RaceReleaseAndCancel(rt *rapid.T) {
	var keys []string
	for _, k := range m.keys {
		if q := m.queue[k]; len(q) > 0 && q[0].kind == cancellable {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return // nothing to do: a no-op step, not a skip (see heldKey)
	}
	key := rapid.SampledFrom(keys).Draw(rt, "race key")
	head := m.queue[key][0]
	go head.cancel()
	require.NoError(rt, m.holder[key].lease.Release(context.Background()))
	m.queue[key] = m.queue[key][1:]
	got := m.settle()
	var o outcome
	var others []outcome
	for _, g := range got {
		if g.c == head {
			o = g
		} else {
			others = append(others, g)
		}
	}
	require.NotNil(rt, o.c, "%v did not return", head)
	if o.lease != nil {
		require.NoError(rt, o.err)
		require.Empty(rt, others, "someone else was granted while %v holds", head)
		head.lease, m.holder[key] = o.lease, head
		return
	}
	require.ErrorIs(rt, o.err, context.Canceled)
	q := m.queue[key]
	if len(q) == 0 {
		require.Empty(rt, others)
		delete(m.holder, key)
		return
	}
	require.Len(rt, others, 1, "the grant passes to exactly one waiter")
	require.Same(rt, q[0], others[0].c, "the grant passes to the next waiter in line")
	require.NotNil(rt, others[0].lease)
	m.queue[key] = q[1:]
	q[0].lease, m.holder[key] = others[0].lease, q[0]
}

// RaceCancelThenAcquireElsewhere is the abort during grant followed, on the
// caller's goroutine, by an acquire of another key, which with two or three
// shards is on another shard ("a" and "b" are). A new caller queues for a
// key nobody waits for; the step cancels its context, then releases the
// key. The release wakes the idle shard, which in practice grants the
// caller before the caller, woken by its cancel, has sent the shard its
// withdrawal (1,999 runs of 2,000 on two cores); so the caller finds the
// grant in its channel as it withdraws, returns its give-up at once, and
// pools its waiter while its cancel is still on the first shard's mailbox.
// Its next Acquire, on the same goroutine and so the same P, takes a waiter
// from the pool at once.
//
// That cancel must touch nothing but the first key: the grant it raced
// passes on (here to nobody, so the key is free, which the step checks),
// and the second acquire is granted, or queued, as if the first had never
// been. Were the shards to share a pool (mutant sharedpool, the bug fixed
// in commit 2e5dbcd), the second acquire would reuse the waiter on the
// other shard, which in practice applies it before the first shard applies
// the stale cancel (1,992 runs of 2,000): the first shard then withdraws
// the waiter from the other shard's table, and the first key leaks.
func (m *providerMachine) RaceCancelThenAcquireElsewhere(rt *rapid.T) {
	var keys []string
	for _, k := range m.keys {
		if m.holder[k] != nil && len(m.queue[k]) == 0 {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 || len(m.keys) < 2 {
		return // nothing to do: a no-op step, not a skip (see heldKey)
	}
	key := rapid.SampledFrom(keys).Draw(rt, "give-up key")
	other := rapid.SampledFrom(slices.DeleteFunc(slices.Clone(m.keys), func(k string) bool { return k == key })).Draw(rt, "then key")
	m.calls++
	first := &pcall{id: m.calls, key: key, kind: cancellable}
	m.calls++
	then := &pcall{id: m.calls, key: other, kind: waitForever}
	ctx, cancel := context.WithCancel(context.Background())
	first.cancel = cancel
	go func() {
		l, err := m.p.Acquire(ctx, key, tenace.LockAcquireOptions{})
		m.results <- outcome{first, l, err} // buffered: it does not block
		l, err = m.p.Acquire(context.Background(), other, tenace.LockAcquireOptions{})
		m.results <- outcome{then, l, err}
	}()
	m.expect(rt) // first is queued

	first.cancel()
	require.NoError(rt, m.holder[key].lease.Release(context.Background()))
	thenGranted := m.holder[other] == nil
	want := []*pcall{first}
	if thenGranted {
		want = append(want, then)
	}
	got := m.expect(rt, want...)
	if o := got[first]; o.lease != nil {
		require.NoError(rt, o.err)
		first.lease, m.holder[key] = o.lease, first
	} else {
		require.ErrorIs(rt, o.err, context.Canceled, "%v: no lease, so it gave up", first)
		delete(m.holder, key) // nobody else waited
		l, err := m.p.Acquire(context.Background(), key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(rt, err)
		require.NotNil(rt, l, "%v gave up and nobody waited: its key is free", first)
		require.NoError(rt, l.Release(context.Background()))
	}
	if !thenGranted {
		m.queue[other] = append(m.queue[other], then)
		return
	}
	o := got[then]
	require.NoError(rt, o.err)
	require.NotNil(rt, o.lease, "%v: a free key is granted at once", then)
	then.lease, m.holder[other] = o.lease, then
}

// Check runs after every action: Size is exact (the shards are idle), and
// no result came that the model did not expect.
func (m *providerMachine) Check(rt *rapid.T) {
	m.expect(rt)
	require.Equal(rt, len(m.holder), m.p.Size(), "keys held or waited for")
	want := tenace.LockStats{Held: len(m.holder)}
	for _, q := range m.queue {
		want.Waiting += len(q)
		want.LongestQueue = max(want.LongestQueue, len(q))
	}
	require.Equal(rt, want, m.p.Stats(), "Stats once settled")
}

// drain releases every holder in turn until every waiter has had the lock;
// then nothing may be left, and every key can be taken at once.
func (m *providerMachine) drain(rt *rapid.T) {
	for _, k := range m.keys {
		for m.holder[k] != nil {
			require.NoError(rt, m.holder[k].lease.Release(context.Background()))
			m.handOn(rt, k)
		}
	}
	synctest.Wait()
	require.Zero(rt, m.p.Size(), "no key left held or waited for")
	require.Zero(rt, m.p.Stats(), "nothing held, nobody waiting")
	for _, k := range m.keys {
		l, err := m.p.Acquire(context.Background(), k, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(rt, err)
		require.NotNil(rt, l, "key %q leaked", k)
		require.NoError(rt, l.Release(context.Background()))
	}
}

// ProviderProperty: goroutines drawn by rapid acquire, hold, release, time
// out and cancel on a few keys, and race releases against cancels and
// against new acquires (a release by CAS against the shard queueing); a
// caller whose grant raced its give-up acquires again at once, on another
// shard, while its cancel may still wait on the first. It checks
// mutual exclusion (exactly the model's holder is granted), FIFO order, exact
// Size, idempotent Release, and no leaked lock at the end. It must run inside
// a testing/synctest bubble; it makes its provider there.
func ProviderProperty(rt *rapid.T) {
	m := &providerMachine{
		results: make(chan outcome, 1024),
		keys:    []string{"a", "b", "c"}[:rapid.IntRange(1, 3).Draw(rt, "keys")], // "a" and "b": two shards of 2 or 3
		holder:  map[string]*pcall{},
		queue:   map[string][]*pcall{},
	}
	m.p = tenace.NewMemoryLockProvider(tenace.WithShards(rapid.IntRange(1, 3).Draw(rt, "shards")))
	defer func() {
		require.NoError(rt, m.p.Close())
		synctest.Wait() // every caller has returned
	}()
	rt.Repeat(map[string]func(*rapid.T){
		"acquire":       m.Acquire,
		"release":       m.Release,
		"release-twice": m.ReleaseTwice,
		"cancel":        m.Cancel,
		"timeout":       m.Timeout,
		"race":          m.RaceReleaseAndCancel,
		"race-acquire":  m.RaceReleaseAndAcquire,
		"race-reuse":    m.RaceCancelThenAcquireElsewhere,
		"":              m.Check,
	})
	m.drain(rt)
}

// BubbleTB wraps the *testing.T of a synctest bubble for rapid.Check, which
// otherwise asks a *testing.T for its Deadline — a call the bubble forbids.
type BubbleTB struct{ *testing.T }
