package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// generic hides the provider's AcquireSet: tenace.AcquireAll then takes the
// keys one by one in sorted order, each on a connection of its own.
type generic struct{ tenace.LockProvider }

// setKeys returns n keys of the test's own, sorted.
func setKeys(t *testing.T, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = keyOf(t, fmt.Sprint(i))
	}
	slices.Sort(keys)
	return keys
}

// lockRow matches locks' answer for a key held by one session.
var lockRow = regexp.MustCompile(`^(\d+):true$`)

// TestSetOneSession: a set is taken by one session, which pg_locks shows
// holding every key of it (the generic path would show one session per
// key); the lease lists the keys sorted, each with its own fencing token,
// which the next grant of the set increments; Stats counts the keys; a
// Release unlocks them all and gives the connection back.
func TestSetOneSession(t *testing.T) {
	srv := server(t)
	p := newProvider(t, srv)
	keys := setKeys(t, 3)
	var last []uint64
	for round := range 2 {
		s, err := tenace.AcquireAll(bg, p, []string{keys[2], keys[0], keys[1]}, tenace.LockAcquireOptions{})
		require.NoError(t, err)
		require.NotNil(t, s)
		require.Equal(t, keys, s.Keys(), "the lease lists the keys in the order taken, sorted")
		pids := map[string]bool{}
		for _, k := range keys {
			m := lockRow.FindStringSubmatch(locks(t, srv, k))
			require.NotNil(t, m, "key %q: %s", k, locks(t, srv, k))
			pids[m[1]] = true
		}
		require.Len(t, pids, 1, "one session holds every key of the set")
		require.Equal(t, fmt.Sprint(pglock.BackendPID(s)), slices.Collect(maps.Keys(pids))[0])
		require.Equal(t, tenace.LockStats{Held: 3}, p.Stats())
		tokens := make([]uint64, len(keys))
		for i, l := range s.Leases() {
			f, ok := l.(tenace.FencedLease)
			require.True(t, ok, "the lease of %q is fenced", keys[i])
			tokens[i] = f.Token()
			if round > 0 {
				require.Greater(t, tokens[i], last[i], "the token of %q grows grant after grant", keys[i])
			}
		}
		last = tokens
		require.NoError(t, s.Release(bg))
		for _, k := range keys {
			require.Empty(t, locks(t, srv, k), "key %q after Release", k)
		}
		require.Equal(t, tenace.LockStats{}, p.Stats())
	}
}

// TestSetAllOrNothing: while another session holds the middle key, a set
// gets (nil, nil) with NoWait and on its Timeout, within the Timeout and a
// bound, and the ctx's error when its ctx ends while it waits; every time,
// the keys it had locked before the held one are unlocked before it
// returns, and every statement of the set ran on one session.
func TestSetAllOrNothing(t *testing.T) {
	srv := server(t)
	keys := setKeys(t, 3)
	other := newProvider(t, srv)
	held := mustAcquire(t, other, keys[1], tenace.LockAcquireOptions{})
	holder := locks(t, srv, keys[1])
	p := newProvider(t, srv)
	var mu sync.Mutex
	pids := map[uint32]bool{}
	p.SetHooks(pglock.Hooks{StatementDone: func(pid uint32, _ bool) {
		mu.Lock()
		pids[pid] = true
		mu.Unlock()
	}})
	nothingHeld := func(why string) {
		t.Helper()
		require.Empty(t, locks(t, srv, keys[0]), "the set's first key %s", why)
		require.Empty(t, locks(t, srv, keys[2]), "the set's last key %s", why)
		require.Equal(t, holder, locks(t, srv, keys[1]), "the held key %s", why)
		require.Equal(t, tenace.LockStats{}, p.Stats(), why)
	}
	named := []string{keys[2], keys[1], keys[0]}
	for _, opts := range []tenace.LockAcquireOptions{{Timeout: tenace.NoWait}, {Timeout: 300 * time.Millisecond}} {
		// The set locks its first key (a statement, and two more to
		// register it on its first use), waits for the held one, and
		// unlocks what it got before its verdict.
		pre := 1
		if opts.Timeout == tenace.NoWait {
			pre = 3
		}
		late := serverControlPath(t, srv, opts.Timeout, pre, 1)
		start := time.Now()
		s, err := tenace.AcquireAll(bg, p, named, opts)
		d := time.Since(start)
		if noReplyOfALoadedMachine(t, err, late) {
			// What it sent is cleaned up in the background: once the
			// server has answered, the set's first key is free.
			waitFree(t, srv, keys[0])
			start, late = time.Now(), serverControl(t, srv, opts.Timeout)
			s, err = tenace.AcquireAll(bg, p, named, opts)
			d = time.Since(start)
			require.False(t, noReplyOfALoadedMachine(t, err, late), "twice")
		}
		require.NoError(t, err, "Timeout %v", opts.Timeout)
		require.Nil(t, s, "Timeout %v", opts.Timeout)
		require.Less(t, d, max(opts.Timeout, 0)+2*time.Second, "the Timeout bounds the set")
		nothingHeld(fmt.Sprintf("after the set's Timeout %v", opts.Timeout))
	}

	ctx, cancel := context.WithCancel(bg)
	r := make(chan error, 1) // the goroutine never blocks on it
	go func() {
		s, err := tenace.AcquireAll(ctx, p, named, tenace.LockAcquireOptions{})
		if s != nil {
			err = errors.Join(err, errors.New("granted"), s.Release(bg))
		}
		r <- err
	}()
	waitForWaiters(t, srv, keys[1], 1)
	require.Regexp(t, lockRow, locks(t, srv, keys[0]), "the set holds its first key while it waits for the second")
	cancel()
	require.ErrorIs(t, <-r, context.Canceled)
	nothingHeld("after the set's ctx ended")

	mu.Lock()
	require.Len(t, pids, 1, "every statement of the sets ran on one session: %v", pids)
	mu.Unlock()

	require.NoError(t, held.Release(bg))
	s, err := tenace.AcquireAll(bg, p, named, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.NotNil(t, s, "the set once its keys are free")
	require.NoError(t, s.Release(bg))
}

// TestSetOrderNoDeadlock: sets of this provider naming the keys in one
// order, and callers of AcquireAll's generic path (one key at a time, each
// on its own connection, as a process without AcquireSet takes them)
// naming them in the other, plus single-key callers, all without a
// Timeout, never wait for each other in a cycle: every call is granted
// (PostgreSQL would report a cycle between sessions as a deadlock error
// after deadlock_timeout), and no two hold a key at once. The keys are
// registered in reverse order, so that their lock ids run opposite to
// their sorted order: a set taken in id order, or in the caller's, would
// meet the generic path head on.
func TestSetOrderNoDeadlock(t *testing.T) {
	srv := server(t)
	keys := setKeys(t, 3)
	p := newProvider(t, srv, pglock.WithMaxConns(32))
	for _, k := range slices.Backward(keys) {
		require.NoError(t, mustAcquire(t, p, k, tenace.LockAcquireOptions{}).Release(bg))
	}
	reversed := slices.Clone(keys)
	slices.Reverse(reversed)
	ctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	holding := map[string]bool{}
	enter := func(ks []string) error {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range ks {
			if holding[k] {
				return fmt.Errorf("%q held twice at once", k)
			}
			holding[k] = true
		}
		return nil
	}
	leave := func(ks []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range ks {
			delete(holding, k)
		}
	}
	const rounds = 15
	errs := make(chan error, 6*rounds)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for i := range rounds {
				var err error
				switch g % 3 {
				case 0, 1:
					var s *tenace.SetLease
					if g%3 == 0 {
						s, err = tenace.AcquireAll(ctx, p, reversed, tenace.LockAcquireOptions{})
					} else {
						s, err = tenace.AcquireAll(ctx, generic{p}, keys, tenace.LockAcquireOptions{})
					}
					if err == nil && s == nil {
						err = errors.New("a set without a Timeout was not granted")
					}
					if err == nil {
						err = enter(s.Keys())
						leave(s.Keys())
						err = errors.Join(err, s.Release(bg))
					}
				case 2:
					k := keys[i%len(keys)]
					var l tenace.LockLease
					if l, err = p.Acquire(ctx, k, tenace.LockAcquireOptions{}); err == nil {
						err = enter([]string{k})
						leave([]string{k})
						err = errors.Join(err, l.Release(bg))
					}
				}
				if err != nil {
					errs <- fmt.Errorf("caller %d, round %d: %w", g, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.Equal(t, tenace.LockStats{}, p.Stats())
}

// TestSetLostWithItsSession: the set's one session terminated
// (pg_terminate_backend) loses every key of the set at once: the
// SetLease's Lost and every key's lease's Lost are closed, each Err wraps
// tenace.ErrLeaseLost; Release says the set was lost; the keys are free
// for others, and Stats holds nothing. (On the generic path, one backend
// holds one key: the others would stay held.)
func TestSetLostWithItsSession(t *testing.T) {
	srv := server(t)
	keys := setKeys(t, 3)
	p := newProvider(t, srv)
	s, err := tenace.AcquireAll(bg, p, keys, tenace.LockAcquireOptions{})
	require.NoError(t, err)
	require.NotNil(t, s)
	srv.Terminate(t, pglock.BackendPID(s.Leases()[1]))
	lost(t, s, "the set after its session ended")
	require.ErrorIs(t, s.Err(), tenace.ErrLeaseLost)
	for i, l := range s.Leases() {
		ll := l.(tenace.LosableLease)
		select {
		case <-ll.Lost():
		default:
			t.Fatalf("the lease of %q is not lost with its set", keys[i])
		}
		require.ErrorIs(t, ll.Err(), tenace.ErrLeaseLost, "key %q", keys[i])
	}
	err = s.Release(bg)
	require.ErrorIs(t, err, tenace.ErrLeaseLost, "Release of a lost set")
	require.True(t, strings.Contains(err.Error(), keys[0]) && strings.Contains(err.Error(), keys[2]), "the error names the set: %v", err)
	require.NoError(t, s.Release(bg), "a second Release does nothing")
	other := newProvider(t, srv)
	again, err := tenace.AcquireAll(bg, other, keys, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.NotNil(t, again, "the keys are free once the set's session ended")
	require.NoError(t, again.Release(bg))
	require.Eventually(t, func() bool { return p.Stats() == tenace.LockStats{} }, 20*time.Second, 5*time.Millisecond)
}

// TestSetTTL: a set's TTL ends every key at once.
func TestSetTTL(t *testing.T) {
	srv := server(t)
	keys := setKeys(t, 2)
	p := newProvider(t, srv)
	clock := &manualClock{now: time.Unix(0, 0)}
	s, err := p.AcquireSet(bg, keys, tenace.LockAcquireOptions{TTL: time.Hour, Clock: clock})
	require.NoError(t, err)
	require.NotNil(t, s)
	clock.advance(time.Hour)
	lost(t, s, "the set at its TTL")
	require.ErrorIs(t, s.Err(), tenace.ErrLeaseExpired)
	for i, l := range s.Leases() {
		lost(t, l.(tenace.LosableLease), "the lease of "+keys[i]+" at the set's TTL")
	}
	require.ErrorIs(t, s.Release(bg), tenace.ErrLeaseExpired)
	require.Eventually(t, func() bool { return locks(t, srv, keys[0]) == "" && locks(t, srv, keys[1]) == "" }, 20*time.Second, 5*time.Millisecond)
}

// lost waits until l is lost, within 20 s.
func lost(t *testing.T, l tenace.LosableLease, what string) {
	t.Helper()
	select {
	case <-l.Lost():
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no loss signalled within 20s", what)
	}
}

// Two accounts moved together: AcquireAll (or a Lock with
// LockOptions.Keys) takes both keys on one session, all or none, in an
// order of its own, so that a transfer the other way never deadlocks with
// this one.
func ExampleProvider_AcquireSet() {
	ctx := context.Background()
	locks, err := pglock.New(ctx, exampleConnString())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer locks.Close()

	set, err := tenace.AcquireAll(ctx, locks, []string{"example/account/B", "example/account/A"}, tenace.LockAcquireOptions{Timeout: 5 * time.Second})
	switch {
	case err != nil:
		fmt.Println("the provider failed:", err)
		return
	case set == nil:
		fmt.Println("an account is busy: none of them was taken")
		return
	}
	defer set.Release(ctx)
	for i, l := range set.Leases() {
		fmt.Println(set.Keys()[i], "fenced:", l.(tenace.FencedLease).Token() > 0)
	}
	// Output:
	// example/account/A fenced: true
	// example/account/B fenced: true
}

// TestSetClose: Close loses a held set, every key of it, and unlocks them
// all before it returns.
func TestSetClose(t *testing.T) {
	srv := server(t)
	keys := setKeys(t, 3)
	p, err := pglock.New(bg, srv.ConnString())
	require.NoError(t, err)
	s, err := p.AcquireSet(bg, keys, tenace.LockAcquireOptions{})
	require.NoError(t, err)
	require.NotNil(t, s)
	require.NoError(t, p.Close())
	lost(t, s, "the set at Close")
	require.ErrorIs(t, s.Err(), tenace.ErrLeaseLost)
	for i, l := range s.Leases() {
		lost(t, l.(tenace.LosableLease), "the lease of "+keys[i]+" at Close")
	}
	for _, k := range keys {
		require.Empty(t, locks(t, srv, k), "key %q once Close returned", k)
	}
	require.Equal(t, tenace.LockStats{}, p.Stats())
}

// TestASetThatGivesUpHasLetGoWhenItReturns: a set whose Timeout passes
// while it waits for a held key returns (nil, nil) only once the keys it
// had locked are unlocked: a NoWait probe from another provider, right
// after the return, is granted the set's first key. The Timeouts are
// short, so that the server's verdict comes as the Timeout ends, with no
// slack for clean-up after it; a round the server did not answer in time
// (ErrNoReply: a loaded machine, as the package doc says, for Timeouts this
// short) checks nothing, and the rounds after it have Timeouts twice as
// long.
func TestASetThatGivesUpHasLetGoWhenItReturns(t *testing.T) {
	srv := server(t)
	keys := setKeys(t, 2)
	other := newProvider(t, srv)
	held := mustAcquire(t, other, keys[1], tenace.LockAcquireOptions{})
	p := newProvider(t, srv)
	probe := newProvider(t, srv)
	require.NoError(t, mustAcquire(t, p, keys[0], tenace.LockAcquireOptions{}).Release(bg)) // a connection in the pool
	require.NoError(t, mustAcquire(t, probe, keys[0], tenace.LockAcquireOptions{}).Release(bg))
	checked, scale := 0, time.Duration(1)
	for try := 0; checked < 20 && try < 400; try++ {
		timeout := time.Duration(1+try%5) * time.Millisecond * scale
		s, err := tenace.AcquireAll(bg, p, keys, tenace.LockAcquireOptions{Timeout: timeout})
		if errors.Is(err, pglock.ErrNoReply) {
			// A loaded machine: what the set sent is cleaned up in the
			// background, and the next round starts once the server has
			// answered, with Timeouts twice as long (up to 1.28 s), so that
			// the rounds that check something come even at load 30.
			waitFree(t, srv, keys[0])
			scale = min(2*scale, 256)
			continue
		}
		require.NoError(t, err, "Timeout %v", timeout)
		require.Nil(t, s, "Timeout %v", timeout)
		l, err := probe.Acquire(bg, keys[0], tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		require.NoError(t, err)
		require.NotNil(t, l, "round %d (Timeout %v): the set returned (nil, nil) still holding its first key", checked, timeout)
		require.NoError(t, l.Release(bg))
		checked++
	}
	t.Logf("%d rounds the server answered in time", checked)
	require.GreaterOrEqual(t, checked, 5, "rounds the server answered in time")
	require.NoError(t, held.Release(bg))
}

// TestASetWhoseVerdictIsLateHasNotGivenUpHolding: a set waiting for a key
// that its own provider holds, whose "held" from the server comes after
// the Timeout and its allowance, returns at the Timeout — and not (nil,
// nil), since the key it locked first is still locked by its session until
// that answer comes: ErrNoReply, whose clean-up runs in the background. A
// hook holds the server's "held" back until AcquireSet has returned, so
// that the answer is late on any machine; the Timeout is generous, not
// the subject.
func TestASetWhoseVerdictIsLateHasNotGivenUpHolding(t *testing.T) {
	srv := server(t)
	keys := setKeys(t, 2)
	probe := newProvider(t, srv)
	for _, k := range keys { // registered: a lock statement says "held" only when it is
		require.NoError(t, mustAcquire(t, probe, k, tenace.LockAcquireOptions{}).Release(bg))
	}
	returned := make(chan struct{})
	p := newProvider(t, srv)
	p.SetHooks(pglock.Hooks{StatementDone: func(_ uint32, locked bool) {
		if !locked { // the "held" of the set's second key
			<-returned
		}
	}})
	held := mustAcquire(t, p, keys[1], tenace.LockAcquireOptions{})
	s, err := p.AcquireSet(bg, keys, tenace.LockAcquireOptions{Timeout: 500 * time.Millisecond})
	free, perr := probe.Acquire(bg, keys[0], tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	close(returned)
	require.NoError(t, perr)
	if free != nil {
		require.NoError(t, free.Release(bg))
	}
	require.Nil(t, s)
	if err == nil {
		require.NotNil(t, free, "the set returned (nil, nil) still holding its first key")
	}
	require.ErrorIs(t, err, pglock.ErrNoReply, "the server's answer came after the Timeout")
	waitFree(t, srv, keys[0])
	require.NoError(t, held.Release(bg))
}
