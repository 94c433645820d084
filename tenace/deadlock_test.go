package tenace_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// A nested Lock on a key its execution holds answers at once with a
// *DeadlockError, without asking the provider (no Timeout is set: before,
// it waited forever); on another key, or another provider, it acquires.
func TestDeadlockSameExecution(t *testing.T) {
	fp := &fakeProvider{}
	for _, tc := range []struct {
		name       string
		outer      tenace.LockOptions
		inner      tenace.LockOptions
		deadlock   string // the key named, "" if none
		innerAsked bool   // whether the inner Lock reaches the provider
	}{
		{"same key", tenace.LockOptions{Key: "a"}, tenace.LockOptions{Key: "a"}, "a", false},
		{"execution key", tenace.LockOptions{}, tenace.LockOptions{}, "job", false},
		{"key in an outer set", tenace.LockOptions{Keys: []string{"b", "a"}}, tenace.LockOptions{Key: "a"}, "a", false},
		{"set with a held key", tenace.LockOptions{Key: "b"}, tenace.LockOptions{Keys: []string{"a", "b"}}, "b", false},
		{"distinct keys", tenace.LockOptions{Key: "a"}, tenace.LockOptions{Key: "b"}, "", true},
		{"another provider", tenace.LockOptions{Key: "a"}, tenace.LockOptions{Key: "a", Provider: fp}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tenace.NewMemoryLockProvider()
			defer p.Close()
			if tc.outer.Provider == nil {
				tc.outer.Provider = p
			}
			if tc.inner.Provider == nil {
				tc.inner.Provider = p
			}
			var rec recorder
			inner := tenace.NewPolicy().WithLock(tc.inner).OnEvent(rec.on)
			ran, size := false, 0
			err := tenace.NewPolicy().WithLock(tc.outer).Execute(context.Background(), func(ctx context.Context) error {
				err := inner.Execute(ctx, func(context.Context) error { ran = true; return nil }, tenace.WithKey("job"))
				size = p.Size()
				return err
			}, tenace.WithKey("job"))
			if tc.deadlock == "" {
				require.NoError(t, err)
				require.True(t, ran)
				return
			}
			var d *tenace.DeadlockError
			require.ErrorAs(t, err, &d)
			require.Equal(t, tc.deadlock, d.Key)
			require.Equal(t, []string{tc.deadlock}, d.Cycle)
			require.Contains(t, err.Error(), "already holds lock \""+tc.deadlock+"\"")
			require.False(t, ran, "fn must not run")
			names := rec.names()
			require.Len(t, names, 2)
			require.Equal(t, tenace.EventLockAcquiring, rec.events[0].Name)
			require.Equal(t, tenace.EventLockDeadlock, rec.events[1].Name)
			require.ErrorAs(t, rec.events[1].Err, &d)
			require.Equal(t, keyCount(tc.outer), size, "the inner Lock took nothing")
		})
	}
}

func keyCount(o tenace.LockOptions) int {
	if len(o.Keys) > 0 {
		return len(o.Keys)
	}
	return 1
}

// The check costs no round trip on any provider: a provider that would
// fail the test if asked for the held key a second time is never asked.
func TestDeadlockNoRoundTrip(t *testing.T) {
	asked := 0
	fp := &fakeProvider{}
	fp.acquire = func(ctx context.Context, key string) (tenace.LockLease, error) {
		asked++
		if asked > 1 {
			return nil, errors.New("asked twice")
		}
		return &fakeLease{p: fp}, nil
	}
	lock := tenace.NewLock(tenace.LockOptions{Provider: fp, Key: "k"})
	p := tenace.NewPolicy().With(lock)
	err := p.Execute(context.Background(), func(ctx context.Context) error {
		// A goroutine started with fn's context is the same execution.
		errc := make(chan error, 1)
		go func() { errc <- p.Execute(ctx, func(context.Context) error { return nil }) }()
		return <-errc
	})
	var d *tenace.DeadlockError
	require.ErrorAs(t, err, &d)
	require.Equal(t, 1, asked)
	require.Equal(t, 1, fp.releaseCount(), "the outer lease is released")
}

// What a context says its execution holds ends when the Lock releases: a
// context kept past its Lock (Go's context.WithoutCancel pattern for work
// that outlives the call, or the context itself) locks the key again, on
// any provider, as one that never held it does.
func TestDeadlockContextOutlivesLock(t *testing.T) {
	for _, tc := range []struct {
		name  string
		outer tenace.LockOptions
		inner tenace.LockOptions
	}{
		{"key", tenace.LockOptions{Key: "k"}, tenace.LockOptions{Key: "k"}},
		{"set, then its key", tenace.LockOptions{Keys: []string{"k", "j"}}, tenace.LockOptions{Key: "k"}},
		{"key, then a set", tenace.LockOptions{Key: "k"}, tenace.LockOptions{Keys: []string{"j", "k"}}},
	} {
		for _, provider := range []string{"memory", "fake"} {
			t.Run(tc.name+"/"+provider, func(t *testing.T) {
				var p tenace.LockProvider = &fakeProvider{}
				if provider == "memory" {
					mp := tenace.NewMemoryLockProvider()
					defer mp.Close()
					p = mp
				}
				tc.outer.Provider, tc.inner.Provider = p, p
				var kept context.Context
				require.NoError(t, tenace.NewPolicy().WithLock(tc.outer).Execute(bg, func(ctx context.Context) error {
					kept = ctx
					return nil
				}))
				inner := tenace.NewPolicy().WithLock(tc.inner)
				for _, ctx := range []context.Context{context.WithoutCancel(kept), kept} {
					ran := false
					require.NoError(t, inner.Execute(ctx, func(context.Context) error { ran = true; return nil }))
					require.True(t, ran)
				}
			})
		}
	}
}

// A context kept past its Lock makes no false cycle: a goroutine of that
// context waiting for k2, held by F, is no holder of k1, so F's wait for
// k1 (held by a plain holder that lets go later) is a wait, not a deadlock.
func TestDeadlockContextOutlivesLockNoFalseCycle(t *testing.T) {
	for _, early := range []bool{false, true} {
		name := "waits after the release"
		if early {
			name = "waits before the release"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := tenace.NewMemoryLockProvider()
				defer p.Close()
				lock := func(key string) tenace.Policy {
					return tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: key})
				}
				// F holds k2 until it is told to ask for k1.
				fHolds, fAsk := make(chan struct{}), make(chan struct{})
				fErr := make(chan error, 1)
				go func() {
					fErr <- lock("k2").Execute(bg, func(ctx context.Context) error {
						close(fHolds)
						<-fAsk
						return lock("k1").Execute(ctx, func(context.Context) error { return nil })
					})
				}()
				<-fHolds
				// S: work started under a Lock on k1, still running after
				// that Lock released k1, waiting for k2.
				sErr := make(chan error, 1)
				stale := make(chan context.Context, 1)
				release := make(chan struct{})
				done := make(chan struct{})
				go func() {
					_ = lock("k1").Execute(bg, func(ctx context.Context) error {
						stale <- ctx
						if early {
							go func() {
								sErr <- lock("k2").Execute(context.WithoutCancel(ctx), func(context.Context) error { return nil })
							}()
							synctest.Wait() // S waits for k2, its context holding k1
						}
						<-release
						return nil
					})
					close(done)
				}()
				ctx := <-stale
				close(release)
				<-done // k1 released
				if !early {
					go func() {
						sErr <- lock("k2").Execute(context.WithoutCancel(ctx), func(context.Context) error { return nil })
					}()
				}
				// A plain holder takes k1, and lets go later.
				h, err := p.Acquire(bg, "k1", tenace.LockAcquireOptions{})
				require.NoError(t, err)
				synctest.Wait()
				close(fAsk)
				synctest.Wait()
				select {
				case err := <-fErr:
					t.Fatalf("F returned %v while k1 is held by a plain holder: no cycle", err)
				default:
				}
				require.NoError(t, h.Release(bg))
				require.NoError(t, <-fErr)
				require.NoError(t, <-sErr)
				require.Zero(t, p.Size())
			})
		})
	}
}

// The Lock passes its LockOptions.Owner to the provider with every
// acquire, for a single key and for each key of a set.
func TestLockPassesItsOwner(t *testing.T) {
	fp := &fakeProvider{}
	for _, opts := range []tenace.LockOptions{{Provider: fp, Key: "k", Owner: "job-7"}, {Provider: fp, Keys: []string{"a", "b"}, Owner: "job-7"}} {
		require.NoError(t, tenace.NewPolicy().WithLock(opts).Execute(bg, func(context.Context) error { return nil }))
	}
	require.Len(t, fp.calls, 3)
	for _, c := range fp.calls {
		require.Equal(t, "job-7", c.opts.Owner, c.key)
	}
}
