package tenace_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
)

// A Lock refused names the holder the memory provider found, with the
// holder's Lock label, and how long it had held the key: at once (NoWait),
// after its timeout, on a shared key, and for a set.
func TestLockRefusalNamesTheHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := tenace.NewMemoryLockProvider(tenace.WithOwner("api-7f9c"))
		defer p.Close()
		holder := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Owner: "nightly-report"})
		for _, tc := range []struct {
			name    string
			opts    tenace.LockOptions
			shared  bool
			message string
		}{
			{"NoWait", tenace.LockOptions{Provider: p, Key: "k", Timeout: tenace.NoWait}, false,
				`tenace: lock "k" not acquired at once (NoWait): held by api-7f9c (nightly-report) for 3m12s; retry later, or wait with a LockOptions.Timeout`},
			{"Timeout", tenace.LockOptions{Provider: p, Key: "k", Timeout: time.Second}, false,
				`tenace: lock "k" not acquired within its 1s timeout: held by api-7f9c (nightly-report) for 3m13s; retry later or raise LockOptions.Timeout`},
			{"Set", tenace.LockOptions{Provider: p, Keys: []string{"z", "k"}, Timeout: time.Second}, false,
				`tenace: lock "k,z" not acquired within its 1s timeout: held by api-7f9c (nightly-report) for 3m13s; retry later or raise LockOptions.Timeout`},
			{"Shared", tenace.LockOptions{Provider: p, Key: "k", Timeout: tenace.NoWait}, true,
				`tenace: lock "k" not acquired at once (NoWait): held shared by api-7f9c (nightly-report) (its oldest holder) for 3m12s; retry later, or wait with a LockOptions.Timeout`},
		} {
			h := holder
			if tc.shared {
				h = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Owner: "nightly-report", Shared: true})
			}
			require.NoError(t, h.Execute(bg, func(context.Context) error {
				time.Sleep(3*time.Minute + 12*time.Second) // fake time: the holder has held "k" this long
				err := tenace.NewPolicy().WithLock(tc.opts).Execute(bg, noop)
				var nae *tenace.LockNotAcquiredError
				require.ErrorAs(t, err, &nae, tc.name)
				require.Equal(t, tc.message, err.Error(), tc.name)
				require.NotNil(t, nae.Holder, tc.name)
				require.Equal(t, "api-7f9c (nightly-report)", nae.Holder.Owner, tc.name)
				require.Equal(t, tc.shared, nae.Holder.Shared, tc.name)
				return nil
			}, tenace.WithKey("k")), tc.name)
		}
	})
}

// A provider used directly reports the holder through OnHeld before it
// answers "not granted", and only then.
func TestMemoryAcquireReportsTheHolderOnHeld(t *testing.T) {
	p := tenace.NewMemoryLockProvider(tenace.WithOwner("svc"))
	defer p.Close()
	l, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Owner: "job-1"})
	require.NoError(t, err)
	var seen []tenace.HolderInfo
	onHeld := func(h tenace.HolderInfo) { seen = append(seen, h) }
	got, err := p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: tenace.NoWait, OnHeld: onHeld})
	require.NoError(t, err)
	require.Nil(t, got)
	got, err = p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: time.Millisecond, OnHeld: onHeld})
	require.NoError(t, err)
	require.Nil(t, got)
	require.Len(t, seen, 2)
	for _, h := range seen {
		require.Equal(t, "svc (job-1)", h.Owner)
		require.False(t, h.Since.IsZero())
	}
	require.NoError(t, l.Release(bg))
	got, err = p.Acquire(bg, "k", tenace.LockAcquireOptions{Timeout: tenace.NoWait, OnHeld: onHeld})
	require.NoError(t, err)
	require.NotNil(t, got, "free again")
	require.Len(t, seen, 2, "a grant calls no OnHeld")
	require.NoError(t, got.Release(bg))
}

// Inspect and List are errors on bad input, and a List's cursor belongs
// to the provider that made it.
func TestMemoryInspectBadInput(t *testing.T) {
	p := tenace.NewMemoryLockProvider(tenace.WithShards(3))
	defer p.Close()
	_, err := p.Inspect(bg, "")
	require.ErrorIs(t, err, tenace.ErrMissingKey)
	for _, c := range []string{"x", "3.0", "-1.0", "0.-1", "0"} {
		_, err = p.List(bg, tenace.ListOptions{Cursor: c})
		require.ErrorIs(t, err, tenace.ErrInvalidOption, c)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	_, err = p.Inspect(ctx, "k")
	require.ErrorIs(t, err, context.Canceled)
	_, err = p.List(ctx, tenace.ListOptions{})
	require.ErrorIs(t, err, context.Canceled)
	require.Panics(t, func() { tenace.WithOwner("") })
	d := tenace.NewMemoryLockProvider()
	defer d.Close()
	require.Contains(t, d.Owner(), "/pid ", "DefaultOwner: host/pid N/suffix")
	require.NotEqual(t, d.Owner(), p.Owner(), "two provider values, two owners")
}

// List under churn stays read-only and answers: every page is well formed
// while other goroutines take and free keys.
func TestMemoryListUnderChurn(t *testing.T) {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	ctx, cancel := context.WithCancel(bg)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			l, err := p.Acquire(ctx, fmt.Sprint("churn/", i%50), tenace.LockAcquireOptions{})
			if err != nil {
				return
			}
			_ = l.Release(ctx)
		}
	}()
	held := mustAcquire(t, p, "churn/held")
	for range 20 {
		found := false
		for c := ""; ; {
			page, err := p.List(bg, tenace.ListOptions{Prefix: "churn/", Cursor: c, Limit: 5})
			require.NoError(t, err)
			for _, k := range page.Keys {
				found = found || k.Key == "churn/held"
				require.NotEmpty(t, k.Holders, k.Key)
			}
			if c = page.Next; c == "" {
				break
			}
		}
		require.True(t, found, "a key held throughout is listed")
	}
	cancel()
	<-done
	require.NoError(t, held.Release(bg))
}

// Inspect tells who holds a key, since when, and who waits for it.
func ExampleMemoryLockProvider_Inspect() {
	ctx := context.Background()
	p := tenace.NewMemoryLockProvider(tenace.WithOwner("billing-7f9c"))
	defer p.Close()

	lease, _ := p.Acquire(ctx, "invoice:42", tenace.LockAcquireOptions{Owner: "nightly-run"})
	defer lease.Release(ctx)

	info, err := p.Inspect(ctx, "invoice:42")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, h := range info.Holders {
		fmt.Printf("%s held by %s, token %d, for less than a minute: %v\n",
			info.Key, h.Owner, h.Token, time.Since(h.Since) < time.Minute)
	}
	fmt.Println("waiting:", info.Waiting)
	// Output:
	// invoice:42 held by billing-7f9c (nightly-run), token 1, for less than a minute: true
	// waiting: 0
}

// List pages through the held keys under a prefix: pass each page's Next
// as the next Cursor until it is "".
func ExampleMemoryLockProvider_List() {
	ctx := context.Background()
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	for _, k := range []string{"invoice:1", "invoice:2", "invoice:3", "report:1"} {
		l, _ := p.Acquire(ctx, k, tenace.LockAcquireOptions{})
		defer l.Release(ctx)
	}

	n := 0
	for cursor := ""; ; {
		page, err := p.List(ctx, tenace.ListOptions{Prefix: "invoice:", Cursor: cursor, Limit: 2})
		if err != nil {
			fmt.Println(err)
			return
		}
		n += len(page.Keys)
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	fmt.Println("invoices held:", n)
	// Output:
	// invoices held: 3
}

// A refusal names the holder: the owner labels of its provider and of its
// Lock, and how long it has held the key (under a second here).
func ExampleLockNotAcquiredError_holder() {
	ctx := context.Background()
	p := tenace.NewMemoryLockProvider(tenace.WithOwner("api-7f9c"))
	defer p.Close()
	other, _ := p.Acquire(ctx, "invoice:42", tenace.LockAcquireOptions{Owner: "nightly-run"})
	defer other.Release(ctx)

	pol := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Timeout: tenace.NoWait})
	err := pol.Execute(ctx, func(context.Context) error { return nil }, tenace.WithKey("invoice:42"))
	var refused *tenace.LockNotAcquiredError
	if errors.As(err, &refused) {
		fmt.Println(refused.Holder.Owner)
		fmt.Println(err)
	}
	// Output:
	// api-7f9c (nightly-run)
	// tenace: lock "invoice:42" not acquired at once (NoWait): held by api-7f9c (nightly-run) for under 1s; retry later, or wait with a LockOptions.Timeout
}
