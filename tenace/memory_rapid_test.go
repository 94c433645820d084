package tenace_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/fakeclock"
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
	deadline time.Duration // on the fake clock, for withTimeout
	lease    tenace.LockLease
}

func (c *pcall) String() string { return fmt.Sprintf("#%d(%s %s)", c.id, c.key, c.kind) }

type outcome struct {
	c     *pcall
	lease tenace.LockLease
	err   error
}

// providerMachine drives a MemoryLockProvider from rapid-drawn actions and
// keeps the obvious model beside it: per key, a holder and a FIFO queue.
// Every Acquire runs on its own goroutine; the test goroutine learns that a
// waiter queued from the provider's hook and each result from one shared
// channel, so it always knows exactly which results to expect next — any
// other result (a grant out of order, a second holder) fails the test.
type providerMachine struct {
	p       *tenace.MemoryLockProvider
	queued  chan string
	results chan outcome
	clk     *fakeclock.Clock
	now     time.Duration
	keys    []string
	holder  map[string]*pcall
	queue   map[string][]*pcall
	calls   int
}

func newProviderMachine(rt *rapid.T) *providerMachine {
	m := &providerMachine{
		queued:  make(chan string, 1024),
		results: make(chan outcome, 1024),
		clk:     fakeclock.New(),
		keys:    []string{"a", "b", "c"}[:rapid.IntRange(1, 3).Draw(rt, "keys")],
		holder:  map[string]*pcall{},
		queue:   map[string][]*pcall{},
	}
	m.p = tenace.NewMemoryLockProvider(
		tenace.WithShards(rapid.IntRange(1, 3).Draw(rt, "shards")),
		tenace.WithQueuedHook(func(k string) { m.queued <- k }),
	)
	return m
}

// next returns the next result, which must be c's.
func (m *providerMachine) next(rt *rapid.T, c *pcall) outcome {
	o := <-m.results
	if o.c != c {
		rt.Fatalf("got a result for %v (lease %v, err %v), expected one for %v", o.c, o.lease != nil, o.err, c)
	}
	return o
}

func (m *providerMachine) Acquire(rt *rapid.T) {
	m.calls++
	c := &pcall{id: m.calls, key: rapid.SampledFrom(m.keys).Draw(rt, "key"), kind: callKind(rapid.IntRange(0, 3).Draw(rt, "kind"))}
	ctx := context.Background()
	opts := tenace.LockAcquireOptions{Clock: m.clk}
	switch c.kind {
	case withTimeout:
		d := time.Duration(rapid.IntRange(1, 50).Draw(rt, "timeout s")) * time.Second
		opts.Timeout, c.deadline = d, m.now+d
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
		o := m.next(rt, c)
		require.NoError(rt, o.err)
		require.NotNil(rt, o.lease, "a free key is granted at once")
		c.lease, m.holder[c.key] = o.lease, c
	case c.kind == noWait:
		o := m.next(rt, c)
		require.NoError(rt, o.err)
		require.Nil(rt, o.lease, "NoWait on a held key")
	default:
		require.Equal(rt, c.key, <-m.queued)
		m.queue[c.key] = append(m.queue[c.key], c)
	}
}

// handOn is the model's release of key: its oldest waiter must be granted.
func (m *providerMachine) handOn(rt *rapid.T, key string) {
	q := m.queue[key]
	if len(q) == 0 {
		delete(m.holder, key)
		return
	}
	next := q[0]
	m.queue[key] = q[1:]
	o := m.next(rt, next)
	require.NoError(rt, o.err)
	require.NotNil(rt, o.lease, "the oldest waiter is granted")
	next.lease, m.holder[key] = o.lease, next
}

func (m *providerMachine) heldKey(rt *rapid.T) string {
	var held []string
	for _, k := range m.keys {
		if m.holder[k] != nil {
			held = append(held, k)
		}
	}
	if len(held) == 0 {
		rt.Skip("nothing held")
	}
	return rapid.SampledFrom(held).Draw(rt, "held key")
}

func (m *providerMachine) Release(rt *rapid.T) {
	key := m.heldKey(rt)
	require.NoError(rt, m.holder[key].lease.Release(context.Background()))
	m.handOn(rt, key)
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
		rt.Skip("no cancellable waiter")
	}
	c := rapid.SampledFrom(cs).Draw(rt, "cancel")
	c.cancel()
	o := m.next(rt, c)
	require.ErrorIs(rt, o.err, context.Canceled)
	require.Nil(rt, o.lease)
	m.remove(c)
}

// Timeout moves the fake clock to the earliest waiting deadline: every
// waiter due by then times out.
func (m *providerMachine) Timeout(rt *rapid.T) {
	cs := m.queuedOf(withTimeout)
	if len(cs) == 0 {
		rt.Skip("no waiter with a timeout")
	}
	slices.SortFunc(cs, func(a, b *pcall) int { return int(a.deadline - b.deadline) })
	m.clk.Advance(cs[0].deadline - m.now)
	m.now = cs[0].deadline
	due := map[*pcall]bool{}
	for _, c := range cs {
		if c.deadline <= m.now {
			due[c] = true
		}
	}
	for range len(due) {
		o := <-m.results
		require.True(rt, due[o.c], "unexpected result for %v", o.c)
		require.NoError(rt, o.err)
		require.Nil(rt, o.lease, "%v timed out", o.c)
		delete(due, o.c)
		m.remove(o.c)
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
		rt.Skip("no key whose oldest waiter is cancellable")
	}
	key := rapid.SampledFrom(keys).Draw(rt, "race key")
	head := m.queue[key][0]
	go head.cancel()
	require.NoError(rt, m.holder[key].lease.Release(context.Background()))
	m.queue[key] = m.queue[key][1:]
	// Two results may come, in either order: head's, and — if head gave
	// up — the grant of the waiter behind it.
	var early []outcome
	var o outcome
	for {
		o = <-m.results
		if o.c == head {
			break
		}
		early = append(early, o)
	}
	if o.lease != nil {
		require.NoError(rt, o.err)
		require.Empty(rt, early, "someone else was granted while %v holds", head)
		head.lease, m.holder[key] = o.lease, head
		return
	}
	require.ErrorIs(rt, o.err, context.Canceled)
	q := m.queue[key]
	if len(q) == 0 {
		require.Empty(rt, early)
		delete(m.holder, key)
		return
	}
	for _, e := range early {
		m.results <- e // put back for handOn
	}
	m.handOn(rt, key)
}

// Check runs after every action: Size is exact once the shards have applied
// every message, and no result came that the model did not expect.
func (m *providerMachine) Check(rt *rapid.T) {
	require.NoError(rt, tenace.SyncProvider(m.p))
	require.Equal(rt, len(m.holder), m.p.Size())
	select {
	case o := <-m.results:
		rt.Fatalf("unexpected result for %v (lease %v, err %v)", o.c, o.lease != nil, o.err)
	default:
	}
}

// drain releases every holder in turn until every waiter got the lock and
// released it; then nothing may be left.
func (m *providerMachine) drain(rt *rapid.T) {
	for _, k := range m.keys {
		for m.holder[k] != nil {
			require.NoError(rt, m.holder[k].lease.Release(context.Background()))
			m.handOn(rt, k)
		}
	}
	require.NoError(rt, tenace.SyncProvider(m.p))
	require.Zero(rt, m.p.Size(), "no key left held or waited for")
	for _, k := range m.keys {
		l, err := m.p.Acquire(context.Background(), k, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(rt, err)
		require.NotNil(rt, l, "key %q leaked", k)
		require.NoError(rt, l.Release(context.Background()))
	}
}

// TestProviderConcurrentProperty: goroutines drawn by rapid acquire, hold,
// release, time out and cancel on a few keys, and race releases against
// cancels; mutual exclusion, FIFO order, exact Size, and no leaked lock.
func TestProviderConcurrentProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := newProviderMachine(rt)
		defer func() { require.NoError(rt, m.p.Close()) }()
		rt.Repeat(map[string]func(*rapid.T){
			"acquire": m.Acquire,
			"release": m.Release,
			"cancel":  m.Cancel,
			"timeout": m.Timeout,
			"race":    m.RaceReleaseAndCancel,
			"":        m.Check,
		})
		m.drain(rt)
	})
}
