package tenace_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

var (
	reader = tenace.LockAcquireOptions{Shared: true}
	writer = tenace.LockAcquireOptions{}
	tryR   = tenace.LockAcquireOptions{Shared: true, Timeout: tenace.NoWait}
	tryW   = tenace.LockAcquireOptions{Timeout: tenace.NoWait}
)

func bulkhead(n int) tenace.LockAcquireOptions {
	return tenace.LockAcquireOptions{Shared: true, Permits: n}
}

func tryBulkhead(n int) tenace.LockAcquireOptions {
	o := bulkhead(n)
	o.Timeout = tenace.NoWait
	return o
}

func acquireOpts(t *testing.T, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions) tenace.LockLease {
	t.Helper()
	l, err := p.Acquire(bg, key, opts)
	require.NoError(t, err)
	require.NotNil(t, l, "granted at once")
	return l
}

func refused(t *testing.T, p tenace.LockProvider, key string, opts tenace.LockAcquireOptions, why string) {
	t.Helper()
	l, err := p.Acquire(bg, key, opts)
	require.NoError(t, err)
	require.Nil(t, l, why)
}

func TestSharedOptionErrors(t *testing.T) {
	p, _ := newProvider(t)
	for name, opts := range map[string]tenace.LockAcquireOptions{
		"negative permits":       {Shared: true, Permits: -1},
		"permits without shared": {Permits: 2},
		"permits beyond int32":   {Shared: true, Permits: 1 << 40},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := p.Acquire(bg, "k", opts)
			require.ErrorIs(t, err, tenace.ErrInvalidOption)
			require.ErrorIs(t, tenace.ValidateAcquire("k", opts), tenace.ErrInvalidOption)
			err = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k", Shared: opts.Shared, Permits: opts.Permits}).Execute(bg, func(context.Context) error {
				t.Fatal("fn ran with an invalid option")
				return nil
			})
			require.ErrorIs(t, err, tenace.ErrInvalidOption)
		})
	}
	t.Run("set", func(t *testing.T) {
		_, err := p.AcquireSet(bg, []string{"a", "b"}, reader)
		require.ErrorIs(t, err, tenace.ErrInvalidOption)
		err = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Keys: []string{"a", "b"}, Shared: true}).Execute(bg, func(context.Context) error { return nil })
		require.ErrorIs(t, err, tenace.ErrInvalidOption)
		require.ErrorContains(t, err, "LockOptions.Shared")
	})
	t.Run("provider without support", func(t *testing.T) {
		// generic hides the memory provider's SupportsShared: the Lock
		// refuses, never takes the key exclusive instead.
		err := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: generic{p}, Key: "k", Shared: true}).Execute(bg, func(context.Context) error {
			t.Fatal("fn ran on a provider without shared locks")
			return nil
		})
		require.ErrorIs(t, err, tenace.ErrInvalidOption)
		require.ErrorContains(t, err, "tenace_test.generic")
		require.Zero(t, p.Size())
	})
}

func TestSharedReadersTogetherWriterAlone(t *testing.T) {
	p, _ := newProvider(t)
	r1 := acquireOpts(t, p, "k", reader)
	r2 := acquireOpts(t, p, "k", reader)
	refused(t, p, "k", tryW, "a writer is refused beside readers")
	require.NoError(t, r1.Release(bg))
	refused(t, p, "k", tryW, "and beside the last reader")
	require.NoError(t, r2.Release(bg))
	w := acquireOpts(t, p, "k", tryW)
	refused(t, p, "k", tryR, "a reader is refused beside a writer")
	refused(t, p, "k", tryW, "and so is a second writer")
	require.NoError(t, w.Release(bg))
	requireIdle(t, p, "k")
}

// TestSharedWriterNotOvertaken: a writer waiting for readers is not
// overtaken by a reader that comes after it, though the readers' lock
// would admit that reader; the reader gets the key after the writer.
func TestSharedWriterNotOvertaken(t *testing.T) {
	p, queued := newProvider(t, tenace.WithShards(1))
	r1 := acquireOpts(t, p, "k", reader)
	w := acquireAsync(bg, p, "k", writer)
	<-queued
	refused(t, p, "k", tryR, "a try does not overtake the waiting writer")
	r2 := acquireAsync(bg, p, "k", reader)
	<-queued
	require.NoError(t, r1.Release(bg))
	got := <-w
	require.NoError(t, got.err)
	require.NotNil(t, got.lease, "the writer is next")
	select {
	case g := <-r2:
		t.Fatalf("the later reader got %v beside the writer", g)
	default:
	}
	require.NoError(t, tenace.SyncProvider(p))
	require.Equal(t, 1, p.Stats().Waiting, "the later reader still waits")
	require.NoError(t, got.lease.Release(bg))
	got = <-r2
	require.NoError(t, got.err)
	require.NoError(t, got.lease.Release(bg))
	requireIdle(t, p, "k")
}

// TestSharedReleaseAdmitsSeveral: a writer's release admits every reader
// queued behind it at once, and stops at the next writer.
func TestSharedReleaseAdmitsSeveral(t *testing.T) {
	p, queued := newProvider(t, tenace.WithShards(1))
	w := acquireOpts(t, p, "k", writer)
	var readers []<-chan acquired
	for range 3 {
		readers = append(readers, acquireAsync(bg, p, "k", reader))
		<-queued
	}
	w2 := acquireAsync(bg, p, "k", writer)
	<-queued
	require.NoError(t, w.Release(bg))
	var leases []tenace.LockLease
	for _, r := range readers {
		got := <-r // all three hold the key together
		require.NoError(t, got.err)
		leases = append(leases, got.lease)
	}
	for _, l := range leases {
		select {
		case g := <-w2:
			t.Fatalf("the second writer got %v beside readers", g)
		default:
		}
		require.NoError(t, l.Release(bg))
	}
	got := <-w2
	require.NoError(t, got.err)
	require.NoError(t, got.lease.Release(bg))
	requireIdle(t, p, "k")
}

// TestSharedPermits: a bulkhead of 2 admits 2 shared holders, and the
// first holder's count wins over a later caller's.
func TestSharedPermits(t *testing.T) {
	p, queued := newProvider(t, tenace.WithShards(1))
	a := acquireOpts(t, p, "k", bulkhead(2))
	b := acquireOpts(t, p, "k", bulkhead(2))
	refused(t, p, "k", tryR, "a third shared caller finds no permit")
	refused(t, p, "k", tryBulkhead(5), "nor does one asking for 5: the first holder's count wins")
	c := acquireAsync(bg, p, "k", bulkhead(2))
	<-queued
	require.NoError(t, a.Release(bg))
	got := <-c
	require.NoError(t, got.err, "a released permit goes to the next waiter")
	require.NoError(t, b.Release(bg))
	require.NoError(t, got.lease.Release(bg))
	requireIdle(t, p, "k")
	// Free again: the next first holder sets the count anew.
	one := acquireOpts(t, p, "k", bulkhead(1))
	refused(t, p, "k", tryBulkhead(2), "a bulkhead of 1 is full")
	require.NoError(t, one.Release(bg))
	requireIdle(t, p, "k")
}

// TestSharedCancelGivesBackThePermit: a shared waiter that gives up, at
// any moment up to its grant, leaves no permit taken.
func TestSharedCancelGivesBackThePermit(t *testing.T) {
	p, queued := newProvider(t, tenace.WithShards(1))
	for i := range 500 {
		w := acquireOpts(t, p, "k", writer)
		ctx, cancel := context.WithCancel(bg)
		r := acquireAsync(ctx, p, "k", bulkhead(1))
		<-queued
		// Cancel, then release at once: the release usually reaches the
		// shard before the waiter wakes to send its cancel, so the grant
		// and the give-up race (abort during grant).
		cancel()
		require.NoError(t, w.Release(bg))
		if got := <-r; got.lease != nil {
			require.NoError(t, got.lease.Release(bg))
		} else {
			require.True(t, errors.Is(got.err, context.Canceled))
		}
		require.NoError(t, tenace.SyncProvider(p))
		require.Zero(t, p.Size(), "iteration %d leaked a permit", i)
	}
}

func TestSharedLockStep(t *testing.T) {
	p, _ := newProvider(t)
	inside := make(chan struct{})
	release := make(chan struct{})
	read := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "cfg", Shared: true})
	done := make(chan error, 2)
	for range 2 {
		go func() {
			done <- read.Execute(bg, func(context.Context) error {
				inside <- struct{}{}
				<-release
				return nil
			})
		}()
	}
	<-inside
	<-inside // both readers are inside at once
	write := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "cfg", Timeout: tenace.NoWait})
	var na *tenace.LockNotAcquiredError
	require.ErrorAs(t, write.Execute(bg, func(context.Context) error { return nil }), &na)
	close(release)
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	require.NoError(t, write.Execute(bg, func(context.Context) error { return nil }))
	requireIdle(t, p, "cfg")
}
