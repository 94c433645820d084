package etcdlock_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/internal/etcdtest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
)

// afterDeath is how long past the cluster's recovery (a new leader elected
// after the leader's death; at once after a follower's) an Acquire started
// at the death must be granted.
const afterDeath = time.Second

// holderWindow is the window of TestAMemberDies' holder and waiter: their
// leases outlast an election on a loaded machine (1.3s seen under CPU
// load; testWindow's lease may reach its loss time 0.83s after the death).
const holderWindow = 6 * time.Second

// TestAMemberDies: on a three-member cluster, with a client on every
// member, one member dies — the leader killed (SIGKILL), a follower
// killed, a follower paused (SIGSTOP) past the window. An Acquire with a
// 5s Timeout started at that moment, on a free key, is granted within
// afterDeath of the cluster's recovery (the new leader seen; for a
// follower, the death itself), beyond a bare timer's lateness armed at the
// recovery; a holder's lease taken before stays held (its keepalives move
// to the live members) whenever the cluster recovered in time for a
// keepalive to land before the lease's loss time, and its waiter, queued
// before the death, is granted once it releases. The paused member is a
// follower: a leader paused past a lease's TTL revokes live leases when it
// runs again (etcd issue 15247; see the package doc).
func TestAMemberDies(t *testing.T) {
	for _, tc := range []struct {
		name   string
		leader bool
		death  func(*etcdtest.Member)
	}{
		{"kill-the-leader", true, (*etcdtest.Member).Kill},
		{"kill-a-follower", false, (*etcdtest.Member).Kill},
		{"pause-a-follower", false, (*etcdtest.Member).Pause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := etcdtest.StartN(t, 3)
			p := newProvider(t, newClient(t, c.Endpoints()...), etcdlock.WithWindow(holderWindow))
			waiterP := newProvider(t, newClient(t, c.Endpoints()...), etcdlock.WithWindow(holderWindow))
			leader := c.Leader()
			victim := leader
			if !tc.leader {
				for _, m := range c.Members {
					if m != leader {
						victim = m
						break
					}
				}
			}
			t.Cleanup(victim.Resume)
			held := mustAcquire(t, p, keyOf(t, "held"), tenace.LockAcquireOptions{})
			waiter := acquireAsync(bg, waiterP, keyOf(t, "held"), tenace.LockAcquireOptions{})
			eventually(t, 10*time.Second, "the waiter queued", func() bool { return waiterP.Stats().Waiting == 1 })

			tc.death(victim)
			died := time.Now()
			granted := acquireAsync(bg, p, keyOf(t, "free"), tenace.LockAcquireOptions{Timeout: 5 * time.Second})
			recovered := died
			if tc.leader {
				// The first member that says it leads: polled, so seen
				// a little after the election.
				var seen atomic.Pointer[etcdtest.Member]
				eventually(t, 10*time.Second, "a new leader", func() bool {
					for _, m := range c.Members {
						if m != victim && m.IsLeader() {
							seen.Store(m)
							return true
						}
					}
					return false
				})
				recovered = time.Now()
			}
			late := timerLateness(afterDeath)
			res := waitFor(t, granted, 10*time.Second, "the Acquire started at the death")
			lateness := late()
			require.NoError(t, res.err)
			require.NotNil(t, res.lease, "not granted on a free key")
			took := res.at.Sub(recovered)
			t.Logf("granted %v after the death, %v after the recovery (%v after the death); a bare timer of %v ran %v late",
				res.at.Sub(died).Round(time.Millisecond), took.Round(time.Millisecond), recovered.Sub(died).Round(time.Millisecond), afterDeath, lateness.Round(time.Millisecond))
			require.Less(t, took, afterDeath+2*lateness, "granted past the recovery + %v and twice a bare timer's lateness", afterDeath)
			require.NoError(t, res.lease.Release(bg))

			if tc.name == "pause-a-follower" {
				// Past the holder's window: its keepalives must have gone
				// through the live members.
				time.Sleep(holderWindow + testWindow) // the window passing is the point
			}
			// The holder's last keepalive before the death may be a
			// renewal interval old: its loss time may come as soon as its
			// window, less the margin and that interval, after the death.
			// A keepalive lands within afterDeath of the recovery, beyond
			// a bare timer's lateness: the lease is kept when that comes
			// first.
			lossBy := holderWindow - min(holderWindow/4, etcdlock.MaxMargin) - holderWindow/3
			inTime := recovered.Sub(died)+afterDeath+2*lateness < lossBy
			kept := !isClosed(held.(tenace.LosableLease).Lost())
			if inTime {
				require.True(t, kept, "the holder lost its lease: %v", held.(tenace.LosableLease).Err())
			} else {
				t.Logf("the cluster recovered %v after the death: a keepalive may come past the holder's loss time, %v after it at the soonest (kept: %v)", recovered.Sub(died).Round(time.Millisecond), lossBy, kept)
			}
			released := time.Now()
			if err := held.Release(bg); kept {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tenace.ErrLeaseLost)
			}
			// A waiter whose watch a stalled member serves looks again
			// within a renewal interval (a third of the window). Its lease
			// is kept as the holder's is.
			late = timerLateness(holderWindow/3 + afterDeath)
			w := waitFor(t, waiter, 10*time.Second, "the waiter queued before the death")
			lateness = late()
			if !inTime && errors.Is(w.err, tenace.ErrLeaseLost) {
				t.Logf("the waiter lost its lease: %v", w.err)
				return
			}
			require.NoError(t, w.err)
			require.NotNil(t, w.lease)
			t.Logf("waiter granted %v after the release; a bare timer ran %v late", w.at.Sub(released).Round(time.Millisecond), lateness.Round(time.Millisecond))
			require.Less(t, w.at.Sub(released), holderWindow/3+afterDeath+2*lateness, "the waiter was granted past a renewal interval + %v after the release", afterDeath)
			require.NoError(t, w.lease.Release(bg))
		})
	}
}

// timeoutBound is how far past its Timeout an Acquire may return (the
// package doc: the Timeout is a bound), beyond a bare timer's lateness
// (timerLateness) armed beside it for the Timeout: what the provider adds,
// not what a loaded machine adds to every wait.
const timeoutBound = 50 * time.Millisecond

// timerLateness arms a bare timer of d and returns a function that waits
// for it and says how late its callback ran: the machine's own lateness
// at that moment, which a bound allows on top of its own.
func timerLateness(d time.Duration) func() time.Duration {
	start := time.Now()
	late := make(chan time.Duration, 1)
	time.AfterFunc(d, func() { late <- time.Since(start) - d })
	return func() time.Duration { return <-late }
}
