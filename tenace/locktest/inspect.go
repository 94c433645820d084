package locktest

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"tenace.dev/tenace"
)

// The inspection cases: run for a provider that implements
// tenace.Inspector (each skips for one that does not).

// ownerLabel is the label the suite gives its grants and waits
// (LockAcquireOptions.Owner), which Inspect must show in HolderInfo.Owner.
const ownerLabel = "locktest-owner"

// hostileKeys are keys that a page or a terminal must show as text, and
// that Inspect and List must return byte for byte.
var hostileKeys = []string{"<script>alert(1)</script>", "bad\xff\xfeutf8", "line\nbreak \"quoted\" \x00"}

// inspector returns p as a tenace.Inspector, or skips the test.
func inspector(t *testing.T, p tenace.LockProvider) tenace.Inspector {
	t.Helper()
	ip, ok := p.(tenace.Inspector)
	if !ok {
		t.Skipf("%T does not implement tenace.Inspector", p)
	}
	return ip
}

// inspect is Inspect of key, failing the test on an error.
func (s *suite) inspect(t *testing.T, ip tenace.Inspector, key string) tenace.KeyInfo {
	t.Helper()
	k, err := ip.Inspect(s.ctx(t), key)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	if k.Key != key {
		t.Fatalf("Inspect(%q).Key = %q, want the key byte for byte", key, k.Key)
	}
	return k
}

// checkSince checks that a Since the provider knows lies between before and
// after, give or take WaitBound (a server's clock is not this process's).
func (s *suite) checkSince(t *testing.T, what string, since, before, after time.Time) {
	t.Helper()
	if since.IsZero() {
		return
	}
	if since.Before(before.Add(-s.caps.WaitBound)) || since.After(after.Add(s.caps.WaitBound)) {
		t.Errorf("%s: Since %v, not between %v and %v (± %v)", what, since, before, after, s.caps.WaitBound)
	}
}

// inspectHeld: a held key shows one exclusive holder, named by the
// provider's owner and the grant's label, with its token; Inspect changes
// nothing; after the release the key shows nobody.
func (s *suite) inspectHeld(t *testing.T) {
	p := s.newProvider(t)
	ip := inspector(t, p)
	key := s.key(t)
	if k := s.inspect(t, ip, key); len(k.Holders) != 0 || k.Waiting != 0 || len(k.Waiters) != 0 {
		t.Fatalf("Inspect of a key never taken = %+v, want no holders and no waiters", k)
	}
	s.assertFree(t, p, key, "after an Inspect of a free key")
	before := time.Now()
	l := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{Owner: ownerLabel})
	after := time.Now()
	k := s.inspect(t, ip, key)
	if len(k.Holders) != 1 {
		t.Fatalf("Inspect of a held key: %d holders, want 1 (%+v)", len(k.Holders), k)
	}
	h := k.Holders[0]
	if !strings.HasSuffix(h.Owner, " ("+ownerLabel+")") || len(h.Owner) == len(" ("+ownerLabel+")") {
		t.Errorf("holder's Owner = %q, want the provider's owner label, then %q", h.Owner, " ("+ownerLabel+")")
	}
	if h.Shared || h.Permits != 0 {
		t.Errorf("exclusive holder shows Shared %v, Permits %d", h.Shared, h.Permits)
	}
	if f, ok := l.(tenace.FencedLease); ok && h.Token != 0 && h.Token != f.Token() {
		t.Errorf("holder's Token = %d, the lease's is %d", h.Token, f.Token())
	}
	s.checkSince(t, "holder", h.Since, before, after)
	if !h.Expires.IsZero() && !h.Expires.After(before) {
		t.Errorf("holder's Expires %v is before the grant (%v)", h.Expires, before)
	}
	s.assertHeld(t, p, key, "after an Inspect of a held key")
	mustRelease(t, l)
	if k := s.inspect(t, ip, key); len(k.Holders) != 0 || k.Waiting != 0 {
		t.Fatalf("Inspect after the release = %+v, want no holders and no waiters", k)
	}
	s.assertFree(t, p, key, "after the release and an Inspect")
}

// inspectWaiter: a caller waiting for a held key appears in Inspect, with
// its label when the provider names waiters, and is gone once it gave up.
func (s *suite) inspectWaiter(t *testing.T) {
	p := s.newProvider(t)
	ip := inspector(t, p)
	key := s.key(t)
	l := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	defer mustRelease(t, l)
	ctx, cancel := context.WithCancel(s.ctx(t))
	defer cancel()
	before := time.Now()
	ch := acquireAsync(ctx, p, key, tenace.LockAcquireOptions{Owner: ownerLabel + "-waiter"})
	var k tenace.KeyInfo
	s.eventually(t, "Inspect counts the waiter", func() bool {
		k = s.inspect(t, ip, key)
		return k.Waiting == 1
	})
	if len(k.Holders) != 1 {
		t.Errorf("while a caller waits: %d holders, want 1", len(k.Holders))
	}
	if len(k.Waiters) > 1 {
		t.Errorf("one caller waits; Waiters names %d", len(k.Waiters))
	}
	for _, w := range k.Waiters {
		if w.Owner != "" && !strings.HasSuffix(w.Owner, " ("+ownerLabel+"-waiter)") {
			t.Errorf("waiter's Owner = %q, want it to end with its label", w.Owner)
		}
		if w.Shared {
			t.Error("an exclusive waiter shows Shared")
		}
		s.checkSince(t, "waiter", w.Since, before, time.Now())
	}
	if k.LongestWait < 0 || k.LongestWait > time.Since(before)+s.caps.WaitBound {
		t.Errorf("LongestWait = %v, the caller has waited %v at most", k.LongestWait, time.Since(before))
	}
	cancel()
	if r := s.wait(t, ch, "the cancelled waiter"); r.lease != nil {
		t.Fatal("a waiter cancelled while the key was held was granted it")
	}
	s.eventually(t, "Inspect forgets the waiter that gave up", func() bool {
		return s.inspect(t, ip, key).Waiting == 0
	})
}

// inspectShared: a key held shared lists each of its holders, shared,
// with the key's permit count.
func (s *suite) inspectShared(t *testing.T) {
	p := s.newProvider(t)
	ip := inspector(t, p)
	key := s.key(t)
	opts := tenace.LockAcquireOptions{Shared: true, Owner: ownerLabel}
	if !s.caps.ReadWrite {
		opts.Permits = 3
	}
	l1 := s.mustAcquire(t, p, key, opts)
	l2 := s.mustAcquire(t, p, key, opts)
	k := s.inspect(t, ip, key)
	if len(k.Holders) != 2 {
		t.Fatalf("a key held by two readers: %d holders, want 2 (%+v)", len(k.Holders), k)
	}
	for _, h := range k.Holders {
		if !h.Shared || h.Permits != opts.Permits {
			t.Errorf("shared holder shows Shared %v, Permits %d; want true, %d", h.Shared, h.Permits, opts.Permits)
		}
		if !strings.HasSuffix(h.Owner, " ("+ownerLabel+")") {
			t.Errorf("shared holder's Owner = %q, want it to end with its label", h.Owner)
		}
	}
	mustRelease(t, l1)
	if k := s.inspect(t, ip, key); len(k.Holders) != 1 {
		t.Errorf("one reader left: %d holders, want 1", len(k.Holders))
	}
	mustRelease(t, l2)
	if k := s.inspect(t, ip, key); len(k.Holders) != 0 {
		t.Errorf("every reader left: %d holders, want 0", len(k.Holders))
	}
}

// list pages through every key held under a prefix with a small Limit:
// each held key exactly once, none outside the prefix, each with its
// holder; hostile keys come back byte for byte.
func (s *suite) list(t *testing.T) {
	p := s.newProvider(t)
	ip := inspector(t, p)
	// The prefix holds the characters a glob (Redis MATCH), a LIKE pattern
	// or a regular expression gives a meaning: List takes them literally.
	base := s.key(t)
	prefix := base + "/[a]%_*?\\/"
	want := map[string]bool{}
	for i := range 7 {
		want[prefix+string(rune('a'+i))] = true
	}
	for _, k := range hostileKeys {
		want[prefix+k] = true
	}
	var leases []tenace.LockLease
	defer func() {
		for _, l := range leases {
			mustRelease(t, l)
		}
	}()
	for k := range want {
		leases = append(leases, s.mustAcquire(t, p, k, tenace.LockAcquireOptions{Owner: ownerLabel}))
	}
	// Outside the prefix: a sibling, and the prefix without its slash.
	for _, k := range []string{strings.TrimSuffix(prefix, "/"), s.key(t)} {
		leases = append(leases, s.mustAcquire(t, p, k, tenace.LockAcquireOptions{}))
	}
	seen := map[string]int{}
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("List: more than 1000 pages of Limit 3 for 10 keys (a cursor that never ends?)")
		}
		page, err := ip.List(s.ctx(t), tenace.ListOptions{Prefix: prefix, Cursor: cursor, Limit: 3})
		if err != nil {
			t.Fatalf("List(prefix %q, cursor %q): %v", prefix, cursor, err)
		}
		if len(page.Keys) > 3 {
			t.Errorf("a page of Limit 3 holds %d keys", len(page.Keys))
		}
		for _, k := range page.Keys {
			seen[k.Key]++
			if !want[k.Key] {
				t.Errorf("List returned %q, not a held key under %q", k.Key, prefix)
				continue
			}
			if len(k.Holders) != 1 || !strings.HasSuffix(k.Holders[0].Owner, " ("+ownerLabel+")") {
				t.Errorf("List's %q has holders %+v, want one, named with %q", k.Key, k.Holders, ownerLabel)
			}
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	for k := range want {
		if seen[k] != 1 {
			t.Errorf("List returned %q %d times, want exactly once", k, seen[k])
		}
	}
	for _, k := range hostileKeys {
		s.inspect(t, ip, prefix+k) // byte for byte, and no error
	}
	for _, l := range leases {
		mustRelease(t, l)
	}
	leases = nil
	s.listLiteralPrefix(t, p, ip, base, prefix)
	if _, err := ip.List(s.ctx(t), tenace.ListOptions{Prefix: prefix, Limit: -1}); !errors.Is(err, tenace.ErrInvalidOption) {
		t.Errorf("List with Limit -1 = %v, want an error wrapping ErrInvalidOption", err)
	}
}

// listLiteralPrefix: List under prefix (base followed by wildcard
// characters) returns none of the keys the prefix would match were one of
// its characters a wildcard. Run alone, with few grants: a provider may
// bound its held keys (pglock's connections).
func (s *suite) listLiteralPrefix(t *testing.T, p tenace.LockProvider, ip tenace.Inspector, base, prefix string) {
	t.Helper()
	in := prefix + "in"
	keys := []string{in}
	for _, r := range []struct{ old, new string }{{"[a]", "a"}, {"%", "x"}, {"_", "x"}, {"*", "xx"}, {"?", "x"}, {"\\", "x"}} {
		keys = append(keys, base+strings.Replace(strings.TrimPrefix(prefix, base), r.old, r.new, 1)+"a")
	}
	var leases []tenace.LockLease
	defer func() {
		for _, l := range leases {
			mustRelease(t, l)
		}
	}()
	for _, k := range keys {
		leases = append(leases, s.mustAcquire(t, p, k, tenace.LockAcquireOptions{}))
	}
	var got []string
	for opts, pages := (tenace.ListOptions{Prefix: prefix, Limit: 2}), 0; pages < 1000; pages++ {
		page, err := ip.List(s.ctx(t), opts)
		if err != nil {
			t.Fatalf("List(prefix %q): %v", prefix, err)
		}
		for _, k := range page.Keys {
			got = append(got, k.Key)
		}
		if page.Next == "" {
			break
		}
		opts.Cursor = page.Next
	}
	if len(got) != 1 || got[0] != in {
		t.Errorf("List(prefix %q) = %q, want only %q: a character of the prefix taken as a wildcard", prefix, got, in)
	}
}

// inspectClosed: after Close, Inspect and List are errors, never an
// empty answer.
func (s *suite) inspectClosed(t *testing.T) {
	p := s.newProvider(t)
	ip := inspector(t, p)
	c, ok := p.(io.Closer)
	if !ok {
		t.Fatalf("%T does not implement io.Closer", p)
	}
	key := s.key(t)
	l := s.mustAcquire(t, p, key, tenace.LockAcquireOptions{})
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_ = l.Release(context.Background())
	if k, err := ip.Inspect(s.ctx(t), key); err == nil {
		t.Errorf("Inspect after Close = (%+v, nil), want an error", k)
	}
	if page, err := ip.List(s.ctx(t), tenace.ListOptions{}); err == nil {
		t.Errorf("List after Close = (%+v, nil), want an error", page)
	}
}
