package tenace_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// sharedFake is a fakeProvider that declares shared locks, so that a
// shared Lock step reaches it.
type sharedFake struct{ *fakeProvider }

func (sharedFake) SupportsShared() bool { return true }

// requireMode checks that every event in events says the mode: Shared
// and Permits.
func requireMode(t *testing.T, events []tenace.Event, shared bool, permits int) {
	t.Helper()
	require.NotEmpty(t, events)
	for _, e := range events {
		require.Equal(t, shared, e.Shared, "%s: Shared", e.Name)
		require.Equal(t, permits, e.Permits, "%s: Permits", e.Name)
	}
}

// TestLockEventsSayTheMode: a bulkhead's Lock emits acquiring, acquired,
// rejected and released with Shared and its Permits; a reader's with
// Shared and Permits 0; a writer's Lock with neither.
func TestLockEventsSayTheMode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider()
		defer p.Close()
		var bulk, tryBulk, read, write recorder
		bulkPol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "b", Shared: true, Permits: 1}).OnEvent(bulk.on)
		tryPol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "b", Shared: true, Permits: 1, Timeout: tenace.NoWait}).OnEvent(tryBulk.on)
		readPol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "rw", Shared: true}).OnEvent(read.on)
		writePol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "rw", Timeout: time.Second}).OnEvent(write.on)
		require.NoError(t, bulkPol.Execute(bg, func(context.Context) error {
			var nae *tenace.LockNotAcquiredError
			require.ErrorAs(t, tryPol.Execute(bg, noop), &nae, "the only permit is taken")
			return nil
		}))
		require.NoError(t, readPol.Execute(bg, func(context.Context) error {
			var nae *tenace.LockNotAcquiredError
			require.ErrorAs(t, writePol.Execute(bg, noop), &nae, "a writer waits its second beside a reader")
			return nil
		}))
		require.Equal(t, []string{"lock.acquiring:b", "lock.acquired:b", "lock.released:b"}, bulk.names())
		requireMode(t, bulk.events, true, 1)
		require.Equal(t, []string{"lock.acquiring:b", "lock.rejected:b"}, tryBulk.names())
		requireMode(t, tryBulk.events, true, 1)
		require.Equal(t, []string{"lock.acquiring:rw", "lock.acquired:rw", "lock.released:rw"}, read.names())
		requireMode(t, read.events, true, 0)
		require.Equal(t, []string{"lock.acquiring:rw", "lock.rejected:rw"}, write.names())
		requireMode(t, write.events, false, 0)
	})
}

// TestSharedLockEventsOfLossFailureAndCancelSayTheMode: the events a
// provider's failure, a lost lease and a cancelled wait end with carry
// the mode too.
func TestSharedLockEventsOfLossFailureAndCancelSayTheMode(t *testing.T) {
	opts := func(p tenace.LockProvider) tenace.LockOptions {
		return tenace.LockOptions{Provider: p, Key: "k", Shared: true, Permits: 4}
	}
	t.Run("failed", func(t *testing.T) {
		fp := &fakeProvider{acquire: func(context.Context, string) (tenace.LockLease, error) { return nil, errBoom }}
		var rec recorder
		err := tenace.NewPolicy().WithLock(opts(sharedFake{fp})).OnEvent(rec.on).Execute(bg, noop)
		require.ErrorIs(t, err, errBoom)
		require.Equal(t, []string{"lock.acquiring:k", "lock.failed:k"}, rec.names())
		requireMode(t, rec.events, true, 4)
		require.True(t, fp.lastCall().opts.Shared, "the provider was asked shared")
		require.Equal(t, 4, fp.lastCall().opts.Permits)
	})
	t.Run("lost", func(t *testing.T) {
		fp := &fakeProvider{}
		lease := &losableLease{fakeLease: fakeLease{p: fp}}
		fp.acquire = func(context.Context, string) (tenace.LockLease, error) { return lease, nil }
		var rec recorder
		err := tenace.NewPolicy().WithLock(opts(sharedFake{fp})).OnEvent(rec.on).Execute(bg, func(ctx context.Context) error {
			lease.Lose(errors.New("the connection dropped"))
			<-ctx.Done()
			return context.Cause(ctx)
		})
		require.ErrorIs(t, err, tenace.ErrLeaseLost)
		require.Equal(t, []string{"lock.acquiring:k", "lock.acquired:k", "lock.lost:k", "lock.released:k"}, rec.names())
		requireMode(t, rec.events, true, 4)
	})
	t.Run("cancelled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := tenace.NewMemoryLockProvider()
			defer p.Close()
			w := mustAcquire(t, p, "k") // a writer holds the key
			defer func() { _ = w.Release(bg) }()
			ctx, cancel := context.WithTimeout(bg, time.Second)
			defer cancel()
			var rec recorder
			err := tenace.NewPolicy().WithLock(opts(p)).OnEvent(rec.on).Execute(ctx, noop)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Equal(t, []string{"lock.acquiring:k", "lock.cancelled:k"}, rec.names())
			requireMode(t, rec.events, true, 4)
		})
	})
}

func TestLogEventsLogsTheMode(t *testing.T) {
	p, _ := newProvider(t)
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	for _, o := range []tenace.LockOptions{
		{Provider: p, Key: "bulk", Shared: true, Permits: 5},
		{Provider: p, Key: "rw", Shared: true},
		{Provider: p, Key: "rw"},
	} {
		require.NoError(t, tenace.NewPolicy().WithLock(o).OnEvent(tenace.LogEvents(logger)).Execute(bg, noop))
	}
	lines := logLines(t, &buf)
	require.Len(t, lines, 9)
	for i, line := range lines {
		delete(line, "wait")
		delete(line, "hold")
		delete(line, "token")
		delete(line, "msg")
		delete(line, "level")
		want := map[string]any{"key": "rw"}
		switch i / 3 {
		case 0:
			want = map[string]any{"key": "bulk", "shared": true, "permits": 5.0}
		case 1:
			want["shared"] = true // no permits: any number of readers
		}
		require.Equal(t, want, line, "line %d", i)
	}
}
