package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"tenace.dev/internal/redistest"
	"tenace.dev/tenace"
	"tenace.dev/tenace/locktest"
	"tenace.dev/tenace/redislock"
)

// scripts counts the scripts a client sends by their number of keys: "5"
// a single acquire, "3n" (n > 1) the set script for n keys.
type scripts struct {
	mu sync.Mutex
	n  map[string]int
}

// countScripts counts the scripts run through c: an EVALSHA refused with
// NOSCRIPT (go-redis then sends EVAL) does not count.
func countScripts(c redis.UniversalClient) *scripts {
	s := &scripts{n: map[string]int{}}
	c.AddHook(s)
	return s
}

func (s *scripts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *scripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if name := redislock.ScriptName(cmd); name != "" && !redis.HasErrorPrefix(err, "NOSCRIPT") {
			s.mu.Lock()
			s.n[name]++
			s.mu.Unlock()
		}
		return err
	}
}
func (s *scripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (s *scripts) get(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[name]
}

// sets is how many set scripts were sent.
func (s *scripts) sets() int { return s.get("acquireSet") }

func clusterClient(t *testing.T) *redis.ClusterClient {
	srv := redistest.StartCluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// lockHeld reports whether key's lock exists on the server.
func lockHeld(t *testing.T, c redis.UniversalClient, key string) bool {
	t.Helper()
	n, err := c.Exists(bg, "tenace:lock:{"+key+"}").Result()
	require.NoError(t, err)
	return n == 1
}

// recv receives from ch, failing the test after 10 s: a wait that hangs.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing within 10s")
		panic("unreachable")
	}
}

// TestSetLocktest runs locktest's set cases: on a standalone server each
// goes through AcquireSet's one script; on a Cluster the suite's keys have
// hash tags of their own, so the same cases take the ordered path.
func TestSetLocktest(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name     string
		client   redis.UniversalClient
		wantSets bool
	}{{"standalone", deadlineClient(t, srv.Addr), true}, {"cluster", clusterClient(t), false}} {
		t.Run(tc.name, func(t *testing.T) {
			n := countScripts(tc.client)
			locktest.Run(t, func(t *testing.T) tenace.LockProvider {
				if !strings.Contains(t.Name(), "/Set") {
					t.Skip("the set cases only (TestConformance runs the rest)")
				}
				return newProvider(t, tc.client, append(kept(), redislock.WithRetryInterval(50*time.Millisecond))...)
			}, locktest.Capabilities{Fencing: true, WaitBound: 5 * time.Second})
			if tc.wantSets {
				require.Positive(t, n.sets(), "the set cases ran the set script")
			} else {
				require.Zero(t, n.sets(), "keys on several slots never go to one script")
			}
		})
	}
}

// TestSetOneScript: a free set is granted by one script (no single
// acquire), on a standalone server whatever the keys and on a Cluster when
// they share a hash tag; each key is held with a fencing token of its own,
// above a single grant's before it, and Release frees them all.
func TestSetOneScript(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name   string
		client redis.UniversalClient
		keys   []string
	}{
		{"standalone", deadlineClient(t, srv.Addr), []string{"c", "a", "b"}},
		{"cluster", clusterClient(t), []string{"acct}9", "acct}1", "acct}5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, tc.client)
			before := mustAcquire(t, p, tc.keys[0], tenace.LockAcquireOptions{})
			require.NoError(t, before.Release(bg))
			n := countScripts(tc.client)
			set, err := tenace.AcquireAll(bg, p, tc.keys, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
			require.NoError(t, err)
			require.NotNil(t, set)
			require.Equal(t, 1, n.get("acquireSet"), "one set script")
			require.Zero(t, n.get("acquire"), "no single acquire")
			require.Len(t, set.Leases(), 3)
			for i, key := range set.Keys() {
				require.True(t, lockHeld(t, tc.client, key), key)
				tok := set.Leases()[i].(tenace.FencedLease).Token()
				if key == tc.keys[0] {
					require.Greater(t, tok, before.(tenace.FencedLease).Token(), "the key's counter goes on")
				}
			}
			single, err := p.Acquire(bg, tc.keys[1], tenace.LockAcquireOptions{Timeout: tenace.NoWait})
			require.NoError(t, err)
			require.Nil(t, single, "a single caller is excluded by the set")
			require.NoError(t, set.Release(bg))
			for _, key := range tc.keys {
				require.False(t, lockHeld(t, tc.client, key), key)
			}
		})
	}
}

// TestSetAllOrNothingWhileOneKeyIsHeld: while a single caller holds b, a
// set of a, b, c takes none of them — with NoWait, and all the while it
// waits — and once b is released the set gets all three, woken by the
// release message (the fallback retry is an hour away).
func TestSetAllOrNothingWhileOneKeyIsHeld(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
	held := mustAcquire(t, p, "b", tenace.LockAcquireOptions{})
	keys := []string{"c", "b", "a"}
	set, err := tenace.AcquireAll(bg, p, keys, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.Nil(t, set)
	require.False(t, lockHeld(t, c, "a"))
	require.False(t, lockHeld(t, c, "c"))

	got := make(chan *tenace.SetLease, 1)
	go func() {
		l, err := tenace.AcquireAll(bg, p, keys, tenace.LockAcquireOptions{})
		if err != nil {
			t.Errorf("AcquireAll: %v", err)
		}
		got <- l
	}()
	waitSubscribed(t, c, "c", 1) // subscribed to every key's channel, the last one too
	require.False(t, lockHeld(t, c, "a"), "a set holds no key while it waits")
	require.False(t, lockHeld(t, c, "c"), "a set holds no key while it waits")
	require.NoError(t, held.Release(bg))
	l := recv(t, got)
	require.NotNil(t, l)
	for _, k := range keys {
		require.True(t, lockHeld(t, c, k), k)
	}
	require.NoError(t, l.Release(bg))
}

// TestSetWakesOnAnyKeysRelease: a set waiting for a (held by one caller)
// and b (by another) tries again when b is released — and hands that
// release on to a single caller waiting for b behind it, which gets b at
// once — then is granted when b and a are free. Every wake-up is a release
// message: the fallback retry is an hour away.
func TestSetWakesOnAnyKeysRelease(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
	ha := mustAcquire(t, p, "a", tenace.LockAcquireOptions{})
	hb := mustAcquire(t, p, "b", tenace.LockAcquireOptions{})
	n := countScripts(c)
	got := make(chan *tenace.SetLease, 1)
	go func() {
		l, err := tenace.AcquireAll(bg, p, []string{"b", "a"}, tenace.LockAcquireOptions{})
		if err != nil {
			t.Errorf("AcquireAll: %v", err)
		}
		got <- l
	}()
	waitSubscribed(t, c, "b", 1)
	single := acquireAsync(bg, p, "b", tenace.LockAcquireOptions{})
	eventually(t, "the single caller waits", func() bool { return n.get("acquire") >= 2 })
	tries := n.sets()
	require.NoError(t, hb.Release(bg))
	r := recv(t, single)
	require.NoError(t, r.err)
	require.NotNil(t, r.lease, "the release the set could not use went on to the single caller")
	require.Greater(t, n.sets(), tries, "the set tried again on b's release")
	require.NoError(t, ha.Release(bg))
	require.NoError(t, r.lease.Release(bg))
	l := recv(t, got)
	require.NotNil(t, l)
	require.NoError(t, l.Release(bg))
}

// TestSetsAndNestedSinglesNeverDeadlock: sets of x and y, and a caller that
// holds y and then asks for x (the opposite of the set's order), with no
// Timeout: a set that held x while it waited for y would deadlock with it.
// The run is bounded: a deadlock ends in the ctx and fails the test.
func TestSetsAndNestedSinglesNeverDeadlock(t *testing.T) {
	_, c := setup(t)
	p := newProvider(t, c, redislock.WithRetryInterval(time.Hour))
	ctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	const rounds = 30
	var inside [2]atomic.Int32 // x, y
	hold := func(which ...int) error {
		for _, i := range which {
			if inside[i].Add(1) != 1 {
				return fmt.Errorf("two holders of key %d", i)
			}
		}
		time.Sleep(100 * time.Microsecond) // let an overlap show
		for _, i := range which {
			inside[i].Add(-1)
		}
		return nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 2 {
		wg.Go(func() {
			for range rounds {
				l, err := tenace.AcquireAll(ctx, p, []string{"x", "y"}, tenace.LockAcquireOptions{})
				if err != nil {
					errs <- fmt.Errorf("set: %w", err)
					return
				}
				err = hold(0, 1)
				_ = l.Release(bg)
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range rounds {
			ly, err := p.Acquire(ctx, "y", tenace.LockAcquireOptions{})
			if err != nil {
				errs <- fmt.Errorf("single y: %w", err)
				return
			}
			lx, err := p.Acquire(ctx, "x", tenace.LockAcquireOptions{})
			if err != nil {
				_ = ly.Release(bg)
				errs <- fmt.Errorf("single x while holding y: %w", err)
				return
			}
			err = hold(0, 1)
			_ = lx.Release(bg)
			_ = ly.Release(bg)
			if err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestSetOnAClusterWithKeysInTwoSlots: keys with different hash tags are
// taken one by one in sorted order (the generic path), all or none.
func TestSetOnAClusterWithKeysInTwoSlots(t *testing.T) {
	c := clusterClient(t)
	p := newProvider(t, c)
	n := countScripts(c)
	set, err := tenace.AcquireAll(bg, p, []string{"b", "a"}, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
	require.NoError(t, err)
	require.NotNil(t, set)
	require.Equal(t, []string{"a", "b"}, set.Keys())
	require.Zero(t, n.sets())
	require.Equal(t, 2, n.get("acquire"), "one single acquire per key")
	require.True(t, lockHeld(t, c, "a"))
	require.True(t, lockHeld(t, c, "b"))
	require.NoError(t, set.Release(bg))

	held := mustAcquire(t, p, "b", tenace.LockAcquireOptions{})
	set, err = tenace.AcquireAll(bg, p, []string{"b", "a"}, tenace.LockAcquireOptions{Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	require.Nil(t, set)
	require.False(t, lockHeld(t, c, "a"), "a was released when b was not granted")
	require.NoError(t, held.Release(bg))
}

// TestSetOutageIsAnError: a set on a server that is gone fails with an
// error, never (nil, nil).
func TestSetOutageIsAnError(t *testing.T) {
	srv, c := setup(t)
	p := newProvider(t, c)
	srv.Kill()
	for _, opts := range []tenace.LockAcquireOptions{{Timeout: tenace.NoWait}, {Timeout: 200 * time.Millisecond}} {
		set, err := tenace.AcquireAll(bg, p, []string{"a", "b"}, opts)
		require.Nil(t, set)
		require.Error(t, err, "%+v", opts)
		require.Contains(t, err.Error(), `the set "a,b"`)
		require.False(t, errors.Is(err, context.DeadlineExceeded), "not the caller's deadline: %v", err)
	}
}

// TestSetUnansweredIsVoidedForEveryKey: a set whose script the server
// leaves unanswered until the Timeout (a stalled server) fails with
// ErrNoReply; the script, run once the server resumes, takes the keys
// (TTL an hour), and the voids queued for every key of the set free them
// all within a few seconds.
func TestSetUnansweredIsVoidedForEveryKey(t *testing.T) {
	srv := redistest.Start(t)
	c := deadlineClient(t, srv.Addr)
	p := newProvider(t, c)
	warm(t, c, p)
	keys := []string{"stall/a", "stall/b", "stall/c"}
	set, err := tenace.AcquireAll(bg, p, keys, tenace.LockAcquireOptions{Timeout: tenace.NoWait}) // loads the script
	require.NoError(t, err)
	require.NoError(t, set.Release(bg))

	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	set, err = tenace.AcquireAll(bg, p, keys, tenace.LockAcquireOptions{Timeout: 100 * time.Millisecond, TTL: time.Hour})
	require.Nil(t, set)
	require.ErrorIs(t, err, redislock.ErrNoReply)
	srv.Resume()
	resumed = true
	within(t, 5*time.Second, "every key of the set freed", func() bool { return len(heldLocks(t, c, "stall/")) == 0 })
	eventually(t, "the janitor done", func() bool {
		pending, running := redislock.PendingVoids(p)
		return pending == 0 && !running
	})
}

// A transfer holds both accounts at once, whichever order callers name
// them in: on a *redis.Client (or keys with a common hash tag on a
// Cluster) one script takes both or neither. (Not run: it needs a Redis
// server on localhost:6379.)
func ExampleProvider_AcquireSet() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	locks := redislock.New(client)
	defer locks.Close()

	ctx := context.Background()
	set, err := tenace.AcquireAll(ctx, locks, []string{"account/7", "account/3"}, tenace.LockAcquireOptions{Timeout: 5 * time.Second})
	if err != nil || set == nil {
		return // Redis failed, or an account stayed held for 5s
	}
	defer set.Release(ctx)
	for i, key := range set.Keys() {
		token := set.Leases()[i].(tenace.FencedLease).Token() // fences writes to key
		_, _ = key, token
	}
}
