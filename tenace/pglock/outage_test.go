package pglock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/pgtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// overrun is how far past its Timeout an Acquire may return (issue 25: the
// Timeout is a bound), measured beside two CPU burners — beyond what the
// machine itself adds (see control): the provider's allowance (30ms), and
// the hand-offs between its goroutines, each of which the burners can
// delay by more than the control's lone timer (a try once took 53ms past
// a 250ms Timeout when the control fired 3ms late).
const overrun = 75 * time.Millisecond

// control starts a bare timer beside a measured Acquire, set for the
// moment the Acquire gives up on a silent server (its Timeout d and the
// reply allowance), and returns a func that waits for it and says how late
// it fired: the scheduling delay of the machine at that moment, which no
// Acquire can avoid (on the shared 2-core machine, with other processes'
// builds beside the burners, a timer fired up to 400ms late). The bounds
// below allow overrun on top of it, so that they measure what the provider
// adds.
func control(d time.Duration) (late func() time.Duration) {
	d += pglock.ReplyAllowance
	r := make(chan time.Duration, 1) // the goroutine never blocks on it
	start := time.Now()
	go func() {
		time.Sleep(d) // the timer under measure, not synchronisation
		r <- time.Since(start) - d
	}()
	return sync.OnceValue(func() time.Duration { return <-r })
}

// serverControl is control for a verdict of the server: a statement on a
// connection of its own, dialled now as the call beside it may have to
// dial, that sleeps on the server until the moment a Timeout of d, started
// now, has its "held" due (d less its lead), then answers. late waits for
// the answer and says how much later than due it came: the delay that the
// machine added at that moment to a reply of the server — a new backend's
// start, its wake-up, the loopback, this process's reading — which no
// provider can avoid.
func serverControl(t *testing.T, srv *pgtest.Server, d time.Duration) (late func() time.Duration) {
	due := d - min(d/3, pglock.VerdictLead)
	r := make(chan time.Duration, 1) // the goroutine never blocks on it
	start := time.Now()
	go func() {
		conn, err := pgx.Connect(bg, srv.ConnString())
		if err != nil {
			r <- -1
			return
		}
		defer conn.Close(bg)
		_, err = conn.Exec(bg, `SELECT pg_sleep(greatest($1::float8 - extract(epoch FROM clock_timestamp() - $2::timestamptz), 0))`, due.Seconds(), start)
		if err != nil {
			r <- -1
			return
		}
		r <- time.Since(start) - due
	}()
	return sync.OnceValue(func() time.Duration {
		l := <-r
		require.GreaterOrEqual(t, l, time.Duration(0), "the control statement failed")
		return l
	})
}

// serverControlPath is serverControl for a call that makes pre round
// trips before its wait for the key (a set's statements on the keys it
// locks first), and post after the server's verdict (the unlock of the
// keys it got): the control makes as many, and between them waits as the
// call's statement does, for the bound it computes from what is left of d
// once its pre round trips are done (see lockTimeout: up to VerdictLead
// before the end, a third of what is left when less) — so that round
// trips slowed by a loaded machine push its verdict back as they push the
// call's. It connects before it returns. late is when its last reply came,
// past d less VerdictLead (a third of d when less), as serverControl's.
// Its wait's statement is prepared as it connects: a call's bound is set
// once its statement is prepared (see the test of that,
// TestTheServersBoundIsSetAfterThePrepare), just before it is sent.
func serverControlPath(t *testing.T, srv *pgtest.Server, d time.Duration, pre, post int) (late func() time.Duration) {
	conn, err := pgx.Connect(bg, srv.ConnString())
	require.NoError(t, err)
	_, err = conn.Exec(bg, controlSleep, 0.0) // pgx prepares it, and keeps it prepared
	require.NoError(t, err)
	due := d - min(d/3, pglock.VerdictLead)
	r := make(chan time.Duration, 1) // the goroutine never blocks on it
	start := time.Now()
	go func() {
		defer conn.Close(bg)
		var err error
		trips := func(n int) {
			for range n {
				if err == nil {
					_, err = conn.Exec(bg, `SELECT 1`)
				}
			}
		}
		trips(pre)
		left := d - time.Since(start)
		if err == nil {
			_, err = conn.Exec(bg, controlSleep, max(left-min(left/3, pglock.VerdictLead), 0).Seconds())
		}
		trips(post)
		if err != nil {
			r <- -1
			return
		}
		r <- time.Since(start) - due
	}()
	return sync.OnceValue(func() time.Duration {
		l := <-r
		require.GreaterOrEqual(t, l, time.Duration(0), "the control statement failed")
		return l
	})
}

// controlSleep is serverControlPath's wait: $1 seconds on the server.
const controlSleep = `SELECT pg_sleep($1::float8)`

// noReplyOfALoadedMachine reports whether err is ErrNoReply, and fails
// the test unless the machine explains it: the control reply beside the
// call (serverControl) came at least the reply allowance late too.
func noReplyOfALoadedMachine(t *testing.T, err error, late func() time.Duration) bool {
	t.Helper()
	l := late()
	if !errors.Is(err, pglock.ErrNoReply) {
		return false
	}
	require.GreaterOrEqual(t, l, pglock.ReplyAllowance, "ErrNoReply (%v), though a reply of the server due at the same moment came in time", err)
	t.Logf("ErrNoReply beside a control reply %v late", l)
	return true
}

// burnCPU starts n goroutines that spin until stop is called (at the
// latest when the test ends); stop returns once they have ended. They
// stand for the rest of a loaded process: timers and the network poller's
// wake-ups come late beside them.
func burnCPU(t *testing.T, n int) (stop func()) {
	var quit atomic.Bool
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for !quit.Load() { // an atomic load per turn: the loop stays preemptible
			}
		})
	}
	var once sync.Once
	stop = func() { once.Do(func() { quit.Store(true); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// lockEvents runs a Lock step with timeout on p for key, and returns the
// names of its events and its error.
func lockEvents(p tenace.LockProvider, key string, timeout time.Duration) ([]string, error) {
	var mu sync.Mutex
	var events []string
	err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: key, Timeout: timeout}).
		OnEvent(func(e tenace.Event) { mu.Lock(); events = append(events, e.Name); mu.Unlock() }).
		Execute(bg, func(context.Context) error { return nil })
	mu.Lock()
	defer mu.Unlock()
	return events, err
}

// timeoutName names a Timeout for a subtest.
func timeoutName(d time.Duration) string {
	if d == tenace.NoWait {
		return "NoWait"
	}
	return d.String()
}

// TestADeadServerIsAnErrorAtOnce: with the server down (connection
// refused), Acquire fails at once with an error that wraps the cause,
// whatever the Timeout, including NoWait — not (nil, nil), and not after
// the Timeout; a Lock step reports lock.failed, never lock.rejected.
func TestADeadServerIsAnErrorAtOnce(t *testing.T) {
	srv := pgtest.Start(t)
	p := newProvider(t, srv)
	srv.Stop()
	for _, timeout := range []time.Duration{tenace.NoWait, 100 * time.Millisecond, 240 * time.Millisecond, time.Second} {
		t.Run(timeoutName(timeout), func(t *testing.T) {
			key := keyOf(t, "k")
			bound := max(timeout, 0) + overrun
			start := time.Now()
			l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: timeout})
			took := time.Since(start)
			t.Logf("Acquire on a dead server: %v after %v", err, took.Round(time.Millisecond))
			require.Nil(t, l)
			require.ErrorIs(t, err, syscall.ECONNREFUSED, "the cause reaches the caller")
			require.False(t, errors.Is(err, context.DeadlineExceeded), "the caller's ctx did not end: %v", err)
			require.Less(t, took, bound)

			start = time.Now()
			events, err := lockEvents(p, key, timeout)
			took = time.Since(start)
			var ue *tenace.UnexpectedError
			require.ErrorAs(t, err, &ue, "a failure, not contention: %v", err)
			require.ErrorIs(t, err, syscall.ECONNREFUSED)
			require.Equal(t, []string{"lock.acquiring", "lock.failed"}, events)
			require.Less(t, took, bound)
		})
	}
}

// TestAStalledClusterIsNoReply: with the whole cluster stopped (SIGSTOP of
// the postmaster and every backend), an Acquire on a free key returns
// within its Timeout + 50 ms, beside two CPU burners, an error wrapping
// pglock.ErrNoReply and tenace.ErrNoReply — whether its statement went
// unanswered on a pooled connection or its dial did; a Lock step reports
// lock.failed, not lock.rejected. What was sent is cleaned up in the
// background: 100 ms after the cluster continues, the key is free for
// another session.
func TestAStalledClusterIsNoReply(t *testing.T) {
	srv := pgtest.Start(t)
	for _, timeout := range []time.Duration{100 * time.Millisecond, 500 * time.Millisecond} {
		t.Run(timeoutName(timeout), func(t *testing.T) {
			p, other := newProvider(t, srv), newProvider(t, srv)
			key := keyOf(t, "k")
			// Registered, so that the statement is the lock's own.
			l := mustAcquire(t, p, key, tenace.LockAcquireOptions{})
			require.NoError(t, l.Release(bg))
			stop := burnCPU(t, 2)
			srv.Stall(t)
			defer srv.Continue()

			// The pool's idle connection: the statement goes unanswered.
			start, late := time.Now(), control(timeout)
			l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: timeout})
			took := time.Since(start)
			t.Logf("Acquire on a stalled cluster: %v after %v (a bare timer: %v late)", err, took.Round(time.Millisecond), late().Round(time.Millisecond))
			require.Nil(t, l)
			require.ErrorIs(t, err, tenace.ErrNoReply, "an outage, not contention")
			require.ErrorIs(t, err, pglock.ErrNoReply)
			require.False(t, errors.Is(err, context.DeadlineExceeded), "the caller's ctx did not end: %v", err)
			require.Less(t, took, timeout+overrun+late())

			// Every connection is in use now: the Lock's Acquire dials, and
			// its startup goes unanswered.
			start, late = time.Now(), control(timeout)
			events, err := lockEvents(p, key, timeout)
			took = time.Since(start)
			t.Logf("Lock on a stalled cluster: %v after %v (a bare timer: %v late)", err, took.Round(time.Millisecond), late().Round(time.Millisecond))
			var ue *tenace.UnexpectedError
			require.ErrorAs(t, err, &ue, "a failure, not contention: %v", err)
			require.ErrorIs(t, err, tenace.ErrNoReply)
			require.Equal(t, []string{"lock.acquiring", "lock.failed"}, events)
			require.Less(t, took, timeout+overrun+late())
			stop()

			srv.Continue()
			time.Sleep(100 * time.Millisecond) // the bound under test, on the server's side
			free, err := other.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
			require.NoError(t, err)
			require.NotNil(t, free, "100ms after the cluster continued, the key is still held or waited for: %s", locks(t, srv, key))
			require.NoError(t, free.Release(bg))
		})
	}
}

// TestAHeldKeyIsContentionUnderLoad: the other side of the rule — a key
// held by another session is (nil, nil) with short Timeouts beside two CPU
// burners, within the Timeout + overrun (beyond the lateness of a bare timer
// due at its give-up or of a server's reply due with its "held"; NoWait
// is one round trip, which only ctx bounds), and lock.rejected through a
// Lock: the server's own verdict arrives in time. A machine can be too
// loaded for that: on the shared 2-core machine beside the burners, a
// loopback round trip took up to 250 ms; at load 10, 7 to 10 tries in ten
// heard the server by the Timeout and its allowance, at load 20, 5 to 7. A
// try that hears nothing is ErrNoReply, rightly — never a lease nor
// another error — and a third of the tries at least must hear the server
// (a provider that cannot hear a held key fails every try).
func TestAHeldKeyIsContentionUnderLoad(t *testing.T) {
	srv := server(t)
	p, other := newProvider(t, srv), newProvider(t, srv)
	key := keyOf(t, "k")
	held := mustAcquire(t, other, key, tenace.LockAcquireOptions{})
	// The pool is warm, as a service's is: a few connections that have
	// prepared the statements (a try that hears nothing keeps its
	// connection until the late answer, and the next try takes another).
	// The warm-up is not measured: a try whose "held" came past the
	// Timeout's slack on the loaded machine (ErrNoReply) warmed its
	// connection all the same.
	var warm []<-chan result
	for range 4 {
		warm = append(warm, acquireAsync(bg, p, key, tenace.LockAcquireOptions{Timeout: 2 * time.Second}))
	}
	for _, r := range warm {
		res := <-r
		if !errors.Is(res.err, pglock.ErrNoReply) {
			require.NoError(t, res.err)
		}
		require.Nil(t, res.lease)
	}
	l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, l)
	defer burnCPU(t, 2)()
	for _, timeout := range []time.Duration{tenace.NoWait, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond} {
		t.Run(timeoutName(timeout), func(t *testing.T) {
			const tries = 10
			var longest time.Duration
			heard := 0
			for i := range tries {
				// Two controls of the machine's delay: a bare timer due when
				// the call gives up on a silent server, and a reply of the
				// server due when its "held" is.
				serverLate := func() time.Duration { return 0 }
				if timeout != tenace.NoWait {
					serverLate = serverControl(t, srv, timeout)
				}
				start, late := time.Now(), control(max(timeout, 0))
				l, err := p.Acquire(bg, key, tenace.LockAcquireOptions{Timeout: timeout})
				took := time.Since(start)
				longest = max(longest, took)
				require.Nil(t, l)
				if err == nil {
					heard++
				} else {
					require.ErrorIs(t, err, pglock.ErrNoReply, "try %d", i)
					t.Logf("try %d: no reply after %v", i, took)
				}
				if timeout != tenace.NoWait { // NoWait is bounded by ctx: see Acquire
					require.Less(t, took, timeout+overrun+max(late(), serverLate()), "try %d", i)
				}
			}
			t.Logf("%d tries on a held key with a %s Timeout: %d heard the server, the longest took %v", tries, timeoutName(timeout), heard, longest.Round(time.Millisecond))
			require.GreaterOrEqual(t, heard, tries/3, "the server's verdict is heard")
			var rejected *tenace.LockNotAcquiredError
			if events, err := lockEvents(p, key, timeout); !errors.Is(err, tenace.ErrNoReply) {
				require.ErrorAs(t, err, &rejected)
				require.Equal(t, []string{"lock.acquiring", "lock.rejected"}, events)
			}
		})
	}
	require.NoError(t, held.Release(bg))
}

// TestAcquireNilContextPanics: a nil ctx is a programmer's mistake, told
// as such, not a nil dereference deeper in.
func TestAcquireNilContextPanics(t *testing.T) {
	p := newProvider(t, server(t))
	require.PanicsWithValue(t, "tenace: pglock.Provider.Acquire: nil context: pass context.Background() or the caller's context", func() {
		//lint:ignore SA1012 the misuse under test
		_, _ = p.Acquire(nil, keyOf(t, "k"), tenace.LockAcquireOptions{})
	})
}
