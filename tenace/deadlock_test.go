package tenace_test

import (
	"context"
	"errors"
	"testing"

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
			require.Equal(t, tenace.EventLockRejected, rec.events[1].Name)
			require.ErrorAs(t, rec.events[1].Err, &d)
			require.Equal(t, countHeld(tc.outer), size, "the inner Lock took nothing")
		})
	}
}

func countHeld(o tenace.LockOptions) int {
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
