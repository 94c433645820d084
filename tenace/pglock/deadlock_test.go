package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/pgtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/pglock"
)

// withDeadlockTimeout returns a provider on srv whose sessions run the
// server's deadlock check d after a wait begins.
func withDeadlockTimeout(t *testing.T, srv *pgtest.Server, d time.Duration) *pglock.Provider {
	t.Helper()
	p, err := pglock.New(bg, fmt.Sprintf("%s options='-c deadlock_timeout=%d'", srv.ConnString(), d.Milliseconds()))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// session is a plain session of another process on srv, which takes the
// advisory locks of p's keys itself; its own deadlock check comes after a
// minute, so that in a cycle the server fails the set's wait, not its.
func session(t *testing.T, srv *pgtest.Server, p *pglock.Provider) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(bg, srv.ConnString())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(bg) })
	_, err = c.Exec(bg, `SET deadlock_timeout = '60s'`)
	require.NoError(t, err)
	return c
}

// lockKey takes key's advisory lock (p's) on c, waiting for it.
func lockKey(c *pgx.Conn, p *pglock.Provider, key string) error {
	_, err := c.Exec(bg, `SELECT pg_advisory_lock($1::int4, id) FROM tenace_lock_keys WHERE key = convert_to($2, 'UTF8')`, p.ClassID(), key)
	return err
}

// TestSetDeadlockAcrossSessions: a set whose session holds its first key
// and waits for the next, while other sessions (other processes) hold that
// one and wait, in a ring of two or three, for the set's first key: the
// server's deadlock detector fails the set's wait, and AcquireSet returns a
// *tenace.DeadlockError naming the keys this process knows, within
// deadlock_timeout and 1 s; it has unlocked its first key by then, so the
// other sessions go on, and its connection takes the set again. Through a
// Lock with Keys, the error is the Lock's, with event lock.deadlock, and fn
// does not run.
func TestSetDeadlockAcrossSessions(t *testing.T) {
	for _, tc := range []struct {
		n       int
		viaLock bool
	}{{2, false}, {3, false}, {2, true}} {
		n := tc.n
		t.Run(fmt.Sprintf("%d sessions, Lock %v", n, tc.viaLock), func(t *testing.T) {
			srv := server(t)
			const deadlockTimeout = 2 * time.Second
			p := withDeadlockTimeout(t, srv, deadlockTimeout)
			keys := setKeys(t, n)
			for _, k := range keys { // their rows
				require.NoError(t, mustAcquire(t, p, k, tenace.LockAcquireOptions{}).Release(bg))
			}
			others := make([]*pgx.Conn, n)
			for i := 1; i < n; i++ {
				others[i] = session(t, srv, p)
				require.NoError(t, lockKey(others[i], p, keys[i]))
			}
			start := time.Now()
			set := make(chan result, 1)
			var events []string // written by the set's goroutine, read after it sent
			ran := false
			go func() {
				if !tc.viaLock {
					l, err := p.AcquireSet(bg, keys[:2], tenace.LockAcquireOptions{Timeout: 15 * time.Second})
					set <- result{l, err}
					return
				}
				err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Keys: keys[:2], Timeout: 15 * time.Second}).
					OnEvent(func(e tenace.Event) { events = append(events, e.Name) }).
					Execute(bg, func(context.Context) error { ran = true; return nil })
				set <- result{nil, err}
			}()
			waitForWaiters(t, srv, keys[1], 1) // the set holds keys[0] and waits for keys[1]
			// Session i (holding keys[i]) waits for keys[i+1]; the last
			// one, for keys[0], closes the ring.
			went := make(chan error, n)
			for i := 1; i < n; i++ {
				go func() { went <- lockKey(others[i], p, keys[(i+1)%n]) }()
				if i+1 < n {
					waitForWaiters(t, srv, keys[i+1], 1)
				}
			}
			r := <-set
			elapsed := time.Since(start)
			require.Nil(t, r.lease)
			var d *tenace.DeadlockError
			require.True(t, errors.As(r.err, &d), "got %v", r.err)
			require.Equal(t, keys[1], d.Key)
			require.Equal(t, []string{keys[1], keys[0]}, d.Cycle)
			require.Less(t, elapsed, deadlockTimeout+time.Second, "the server's verdict took %v", elapsed)
			if tc.viaLock {
				require.False(t, ran, "fn ran")
				require.Contains(t, events, tenace.EventLockDeadlock)
			}
			// The others go on: the last gets keys[0], then, releasing
			// everything, the one before it, and so on.
			for i := n - 1; i >= 1; i-- {
				select {
				case err := <-went:
					require.NoError(t, err)
				case <-time.After(15 * time.Second):
					t.Fatalf("the sessions of the cycle did not go on: %s", locks(t, srv, keys[0]))
				}
				_, err := others[i].Exec(bg, `SELECT pg_advisory_unlock_all()`)
				require.NoError(t, err)
			}
			l, err := p.AcquireSet(bg, keys[:2], tenace.LockAcquireOptions{Timeout: 15 * time.Second})
			require.NoError(t, err)
			require.NotNil(t, l)
			require.NoError(t, l.Release(bg))
		})
	}
}

// TestSetChainIsNoDeadlock: a set that waits for a key whose holder (a
// session of another process) waits for nothing and releases it after
// 1.5 s — past the server's deadlock check, at 200 ms — gets the set: a
// chain of waits is no cycle, and is not reported.
func TestSetChainIsNoDeadlock(t *testing.T) {
	srv := server(t)
	p := withDeadlockTimeout(t, srv, 200*time.Millisecond)
	keys := setKeys(t, 2)
	for _, k := range keys {
		require.NoError(t, mustAcquire(t, p, k, tenace.LockAcquireOptions{}).Release(bg))
	}
	holder := session(t, srv, p)
	require.NoError(t, lockKey(holder, p, keys[1]))
	set := make(chan result, 1)
	go func() {
		l, err := p.AcquireSet(bg, keys, tenace.LockAcquireOptions{Timeout: 15 * time.Second})
		set <- result{l, err}
	}()
	waitForWaiters(t, srv, keys[1], 1)
	// The holder's 1.5 s is the server's clock at work: its deadlock
	// check runs during it.
	time.Sleep(1500 * time.Millisecond)
	_, err := holder.Exec(bg, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	r := <-set
	require.NoError(t, r.err)
	require.NotNil(t, r.lease)
	require.NoError(t, r.lease.Release(bg))
}
