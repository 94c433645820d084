package locktest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tenace.dev/tenace"
)

// The sets of keys: tenace.AcquireAll on the provider — its AcquireSet when
// it is a tenace.MultiLockProvider, else the generic path that acquires the
// keys one by one in sorted order — so that every provider is checked for
// sets, also one that knows nothing of them.

// keySet returns n keys of the subtest's own, sorted.
func (s *suite) keySet(t *testing.T, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = s.key(t)
	}
	slices.Sort(keys)
	return keys
}

func (s *suite) setBadInput(t *testing.T) {
	p := s.newProvider(t)
	k := s.keySet(t, 2)
	for _, keys := range [][]string{nil, {}, {k[0], ""}} {
		if l, err := tenace.AcquireAll(s.ctx(t), p, keys, tenace.LockAcquireOptions{}); l != nil || !errors.Is(err, tenace.ErrMissingKey) {
			t.Fatalf("AcquireAll(%q) = (%v, %v), want ErrMissingKey", keys, l, err)
		}
	}
	if l, err := tenace.AcquireAll(s.ctx(t), p, []string{k[0], k[1], k[0]}, tenace.LockAcquireOptions{}); l != nil || !errors.Is(err, tenace.ErrInvalidOption) {
		t.Fatalf("AcquireAll with a key named twice = (%v, %v), want an error wrapping ErrInvalidOption", l, err)
	}
	s.assertFree(t, p, k[0], "after refused sets")
}

// setPathsAgree: tenace.AcquireAll gives the same outcome through the
// provider itself (its AcquireSet, when it has one) and through a plain
// wrapper that hides everything but Acquire (AcquireAll's generic path),
// over a table of inputs: good sets, free and held, and each kind of bad
// input, a shared set among them. Nothing is left held either way.
func (s *suite) setPathsAgree(t *testing.T) {
	p := s.newProvider(t)
	plain := struct{ tenace.LockProvider }{p}
	k := s.keySet(t, 3)
	outcome := func(l *tenace.SetLease, err error) string {
		switch {
		case l != nil && err == nil:
			return "granted"
		case l != nil:
			return fmt.Sprintf("a lease and the error %v", err)
		case err == nil:
			return "not granted"
		case errors.Is(err, tenace.ErrMissingKey):
			return "ErrMissingKey"
		case errors.Is(err, tenace.ErrInvalidOption):
			return "ErrInvalidOption"
		}
		return fmt.Sprintf("the error %v", err)
	}
	noWait := tenace.LockAcquireOptions{Timeout: tenace.NoWait}
	for _, tc := range []struct {
		name string
		keys []string
		opts tenace.LockAcquireOptions
		held bool // k[1] is held by another caller
		want string
	}{
		{"free", []string{k[2], k[0]}, noWait, false, "granted"},
		{"one key held", []string{k[2], k[1], k[0]}, noWait, true, "not granted"},
		{"one key held, with a Timeout", []string{k[1], k[0]}, tenace.LockAcquireOptions{Timeout: 50 * time.Millisecond}, true, "not granted"},
		{"no keys", nil, noWait, false, "ErrMissingKey"},
		{"an empty key", []string{k[0], ""}, noWait, false, "ErrMissingKey"},
		{"a key named twice", []string{k[0], k[2], k[0]}, noWait, false, "ErrInvalidOption"},
		{"shared", []string{k[0], k[2]}, tenace.LockAcquireOptions{Timeout: tenace.NoWait, Shared: true}, false, "ErrInvalidOption"},
		{"shared, with permits", []string{k[0], k[2]}, tenace.LockAcquireOptions{Timeout: tenace.NoWait, Shared: true, Permits: 2}, false, "ErrInvalidOption"},
		{"permits", []string{k[0], k[2]}, tenace.LockAcquireOptions{Timeout: tenace.NoWait, Permits: 2}, false, "ErrInvalidOption"},
		{"negative Timeout", []string{k[0], k[2]}, tenace.LockAcquireOptions{Timeout: -2 * time.Second}, false, "ErrInvalidOption"},
		{"negative TTL", []string{k[0], k[2]}, tenace.LockAcquireOptions{Timeout: tenace.NoWait, TTL: -time.Second}, false, "ErrInvalidOption"},
		{"an empty key and shared", []string{"", k[0]}, tenace.LockAcquireOptions{Shared: true}, false, "ErrMissingKey"},
	} {
		var holder tenace.LockLease
		if tc.held {
			holder = s.mustAcquire(t, p, k[1], tenace.LockAcquireOptions{})
		}
		var got [2]string
		for i, via := range []tenace.LockProvider{p, plain} {
			l, err := tenace.AcquireAll(s.ctx(t), via, tc.keys, tc.opts)
			// A server that did not answer in time (a loaded machine) says
			// nothing of the option rules compared here: ask again, a
			// bounded number of times, and compare the answer that came.
			for try := 1; try < 5 && l == nil && errors.Is(err, tenace.ErrNoReply); try++ {
				t.Logf("%s: AcquireAll: %v; asking again (%d)", tc.name, err, try)
				l, err = tenace.AcquireAll(s.ctx(t), via, tc.keys, tc.opts)
			}
			got[i] = outcome(l, err)
			if l != nil {
				if err := l.Release(s.ctx(t)); err != nil {
					t.Fatalf("%s: Release: %v", tc.name, err)
				}
			}
		}
		if got[0] != got[1] || got[0] != tc.want {
			t.Errorf("%s: AcquireAll(%q, %+v): through the provider %s, through a plain wrapper %s; want %s", tc.name, tc.keys, tc.opts, got[0], got[1], tc.want)
		}
		if holder != nil {
			if err := holder.Release(s.ctx(t)); err != nil {
				t.Fatalf("%s: Release: %v", tc.name, err)
			}
		}
		for _, key := range k {
			s.assertFree(t, p, key, tc.name)
		}
	}
}

// setAllOrNothing: while the middle key of a set is held, the set takes
// none of its keys — on a Timeout, with NoWait, when its ctx ends — and once
// it is free, all of them, one lease per key.
func (s *suite) setAllOrNothing(t *testing.T) {
	p := s.newProvider(t)
	k := s.keySet(t, 3)
	named := []string{k[2], k[1], k[0]}
	held := s.mustAcquire(t, p, k[1], tenace.LockAcquireOptions{})
	free := func(why string) {
		t.Helper()
		s.assertFree(t, p, k[0], why)
		s.assertFree(t, p, k[2], why)
	}
	for _, opts := range []tenace.LockAcquireOptions{{Timeout: tenace.NoWait}, {Timeout: 100 * time.Millisecond}} {
		l, err := tenace.AcquireAll(s.ctx(t), p, named, opts)
		// A server that did not answer in time (a loaded machine: a
		// distributed provider cannot tell a late "held" from silence)
		// says nothing of the set's outcome: ask again, a bounded number
		// of times. What an unanswered try sent is undone in the
		// background, so the keys are then checked free once that is done.
		unanswered := false
		for try := 1; try < 5 && l == nil && errors.Is(err, tenace.ErrNoReply); try++ {
			t.Logf("AcquireAll(%+v): %v; asking again (%d)", opts, err, try)
			unanswered = true
			l, err = tenace.AcquireAll(s.ctx(t), p, named, opts)
		}
		if err != nil || l != nil {
			t.Fatalf("AcquireAll(%+v) with a key held = (%v, %v), want (nil, nil)", opts, l, err)
		}
		why := fmt.Sprintf("after a set not granted (%+v)", opts)
		if !unanswered {
			free(why)
			continue
		}
		for _, key := range []string{k[0], k[2]} {
			s.eventually(t, why+": "+key+" free once the unanswered tries are undone", func() bool {
				l, err := p.Acquire(s.ctx(t), key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
				if l != nil {
					mustRelease(t, l)
				}
				return l != nil && err == nil
			})
		}
	}
	ctx, cancel := context.WithTimeout(s.ctx(t), 100*time.Millisecond)
	l, err := tenace.AcquireAll(ctx, p, named, tenace.LockAcquireOptions{})
	cancel()
	if l != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireAll whose ctx ends while a key is held = (%v, %v), want ctx's error", l, err)
	}
	free("after a set whose ctx ended")
	mustRelease(t, held)

	l, err = tenace.AcquireAll(s.ctx(t), p, named, tenace.LockAcquireOptions{Timeout: s.caps.WaitBound})
	if err != nil || l == nil {
		t.Fatalf("AcquireAll of free keys = (%v, %v), want a lease", l, err)
	}
	got := slices.Sorted(slices.Values(l.Keys()))
	if !slices.Equal(got, k) || len(l.Leases()) != len(k) {
		t.Fatalf("the lease holds %q with %d leases, want %q, one lease each", l.Keys(), len(l.Leases()), k)
	}
	for _, key := range k {
		s.assertHeld(t, p, key, "while the set is held")
	}
	if s.caps.Fencing {
		for i, pl := range l.Leases() {
			if f, ok := pl.(tenace.FencedLease); !ok || f.Token() == 0 {
				t.Fatalf("the lease of %q has no fencing token", l.Keys()[i])
			}
		}
	}
	mustRelease(t, l)
	mustRelease(t, l) // a second Release does nothing
	for _, key := range k {
		s.assertFree(t, p, key, "after the set's Release")
	}
}

// setExclusion: workers take overlapping sets of three keys, each naming
// them in an order of its own (the opposite orders among them), with no
// Timeout: no two holders of a key at once, and nobody waits forever (the
// suite's ctx would end the wait).
func (s *suite) setExclusion(t *testing.T) {
	p := s.newProvider(t)
	k := s.keySet(t, 3)
	orders := [][]string{
		{k[0], k[1]}, {k[1], k[0]}, {k[2], k[1], k[0]}, {k[0], k[2]}, {k[2], k[0], k[1]}, {k[1], k[2]},
	}
	const rounds = 10
	var inside [3]atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, len(orders))
	ctx := s.ctx(t)
	for _, keys := range orders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				l, err := tenace.AcquireAll(ctx, p, keys, tenace.LockAcquireOptions{})
				if err != nil || l == nil {
					errs <- fmt.Errorf("AcquireAll(%q) = (%v, %v): a deadlock ends in the suite's ctx", keys, l, err)
					return
				}
				var err2 error
				for _, key := range keys {
					if n := inside[slices.Index(k, key)].Add(1); n != 1 && err2 == nil {
						err2 = fmt.Errorf("key %q: %d holders at once", key, n)
					}
				}
				time.Sleep(100 * time.Microsecond) // let an overlap show
				for _, key := range keys {
					inside[slices.Index(k, key)].Add(-1)
				}
				if err := l.Release(context.Background()); err != nil && err2 == nil {
					err2 = fmt.Errorf("release: %v", err)
				}
				if err2 != nil {
					errs <- err2
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, key := range k {
		s.assertFree(t, p, key, "after every worker released")
	}
}
