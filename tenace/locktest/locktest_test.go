package locktest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"tenace.dev/tenace"
	"tenace.dev/tenace/locktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// brokenCases maps each broken provider to the subtests of the suite that
// must fail it: the rule it breaks, and where the suite checks that rule.
var brokenCases = map[string][]string{
	// Acquire's results.
	"grants-never":        {"Granted"},
	"timeout-is-error":    {"NotGrantedInTime"},
	"timeout-ignored":     {"NotGrantedInTime"},
	"timeout-early":       {"NotGrantedInTime"},
	"clock-ignored":       {"TimeoutOnClock"},
	"timeout-waits-whole": {"GrantAfterRelease"},
	"nowait-waits":        {"NoWait"},
	"ended-ctx-holds":     {"ContextEndedOnEntry"},
	"cancel-is-nil":       {"ContextEndedOnEntry", "ContextEndsWhileWaiting"},
	"deadline-as-timeout": {"ContextEndsWhileWaiting"},
	"ignores-bad-input":   {"BadInput"},
	"bad-input-unwrapped": {"BadInput"},
	"shared-as-exclusive": {"SharedRefused"},
	// No lease returned: nothing left behind.
	"leaks-on-cancel":   {"CancelRacingGrant"},
	"drops-raced-grant": {"CancelRacingGrant"},
	"ghost-waiter":      {"ContextEndsWhileWaiting", "NoLeakAfterTimeoutsAndCancels"},
	// Exclusion and release.
	"grants-always":              {"MutualExclusion"},
	"one-lock-for-all-keys":      {"DistinctKeysIndependent"},
	"release-noop":               {"GrantAfterRelease"},
	"second-release-errors":      {"ReleaseIdempotent"},
	"stale-release-frees-holder": {"ReleaseIdempotent", "ReleaseRetryable", "StaleReleaseAfterLoss"},
	"release-gives-up":           {"ReleaseRetryable"},
	// What the capabilities promise.
	"lifo":                  {"FIFO"},
	"stats-waiting-stuck":   {"ExactStats"},
	"tokens-repeat":         {"FencingTokens"},
	"lost-new-channel":      {"LosableLease"},
	"lost-on-release":       {"LosableLease"},
	"ttl-ignored":           {"TTL"},
	"ttl-early":             {"TTL"},
	"ttl-lost-never-closes": {"TTL"},
	"ttl-err-not-expired":   {"TTL"},
	"close-strands-waiters": {"Close"},
	"close-still-grants":    {"Close"},
	"close-keeps-leases":    {"Close"},
	"per-value-locks":       {"SharedBetweenProviders"},
	"tokens-restart":        {"SharedBetweenProviders"},
}

// The suite must fail a provider that breaks the contract. Each broken
// provider below runs the subtests that guard its rule in a child process (a
// failing suite would fail this test), and the test checks that each of them
// failed.
func TestTheSuiteFailsBrokenProviders(t *testing.T) {
	if testing.Short() && os.Getenv("CI") == "" {
		t.Skip("runs the suite in child processes (never skipped with CI set)")
	}
	for broken, subtests := range brokenCases {
		t.Run(broken, func(t *testing.T) {
			t.Parallel()
			// Bounded, so that a suite that hangs on a broken provider
			// fails this test instead of stalling the run.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			quoted := make([]string, len(subtests))
			for i, s := range subtests {
				quoted[i] = regexp.QuoteMeta(s)
			}
			run := fmt.Sprintf("-test.run=^TestBrokenProvider$/^(%s)$", strings.Join(quoted, "|"))
			cmd := exec.CommandContext(ctx, os.Args[0], run, "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "LOCKTEST_BROKEN="+broken)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a provider that %s:\n%s", broken, out)
			}
			for _, subtest := range subtests {
				if want := "--- FAIL: TestBrokenProvider/" + subtest + " "; !strings.Contains(string(out), want) {
					t.Errorf("the suite did not fail %s for a provider that %s:\n%s", subtest, broken, out)
				}
			}
		})
	}
}

// TestBrokenProvider runs the suite against the broken provider named by
// LOCKTEST_BROKEN; without it, it does nothing.
func TestBrokenProvider(t *testing.T) {
	broken := os.Getenv("LOCKTEST_BROKEN")
	if broken == "" {
		// Not a test of its own: the child-process entry point of
		// TestTheSuiteFailsBrokenProviders, which sets the variable.
		return
	}
	if _, ok := brokenCases[broken]; !ok {
		t.Fatalf("no broken provider %q", broken)
	}
	runSuite(t, broken)
}

// TestReferenceProvider: the provider the broken ones break passes the whole
// suite, every capability claimed; so each broken provider fails for the one
// rule it breaks.
func TestReferenceProvider(t *testing.T) { runSuite(t, "") }

func runSuite(t *testing.T, broken string) {
	servers := &servers{m: map[*testing.T]*server{}}
	locktest.Run(t, func(t *testing.T) tenace.LockProvider {
		srv := servers.get(t)
		if broken == "per-value-locks" {
			srv = newServer(t)
		}
		p := &refProvider{srv: srv, broken: broken}
		p.closing, p.close = context.WithCancel(context.Background())
		t.Cleanup(func() { _ = p.Close() })
		return p
	}, locktest.Capabilities{
		FIFO: true, ExactStats: true, Fencing: true, Losable: true, TTL: true, Close: true, Shared: true,
		Lose:      func(t *testing.T, l tenace.LockLease) { l.(*refLease).lose(tenace.ErrLeaseLost) },
		WaitBound: 2 * time.Second,
	})
}

// server is what the provider values of one subtest share, as processes
// share a lock server: a MemoryLockProvider, and the lease holding each key.
type server struct {
	mem *tenace.MemoryLockProvider

	mu      sync.Mutex
	holders map[string]*refLease       // the lease holding each key
	parked  map[string][]chan struct{} // "lifo": the waiters parked on each key, last on top
	nParked int                        // waiters outside mem's queue, counted in Waiting
	gaveUp  atomic.Int64               // "stats-waiting-stuck": waiters that gave up
}

func newServer(t *testing.T) *server {
	srv := &server{mem: tenace.NewMemoryLockProvider(), holders: map[string]*refLease{}, parked: map[string][]chan struct{}{}}
	t.Cleanup(func() { _ = srv.mem.Close() })
	return srv
}

// servers holds the server of each subtest.
type servers struct {
	mu sync.Mutex
	m  map[*testing.T]*server
}

func (s *servers) get(t *testing.T) *server {
	s.mu.Lock()
	defer s.mu.Unlock()
	if srv := s.m[t]; srv != nil {
		return srv
	}
	srv := newServer(t)
	s.m[t] = srv
	return srv
}

// refProvider is a provider value on a server, with every capability the
// suite checks: leases that are fenced and losable, with a TTL, Close, and
// locks shared with the subtest's other provider values. broken names the
// one rule it breaks on purpose; "" breaks none.
type refProvider struct {
	srv    *server
	broken string

	closing context.Context // ends at Close
	close   context.CancelFunc

	mu    sync.Mutex
	held  map[*refLease]struct{} // leases held through this value, lost at Close
	first uint64                 // "tokens-restart": the first token this value granted, less one
	began bool                   // "tokens-restart": first is set
}

var errClosed = fmt.Errorf("refProvider: %w", tenace.ErrProviderClosed)

func (p *refProvider) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	if err := tenace.ValidateAcquire(key, opts); err != nil {
		switch p.broken {
		case "ignores-bad-input":
			return nil, nil
		case "bad-input-unwrapped":
			return nil, errors.New("bad input")
		}
		return nil, err
	}
	if opts.Shared && p.broken != "shared-as-exclusive" {
		return nil, fmt.Errorf("%w: the reference provider has no shared locks", tenace.ErrInvalidOption)
	}
	closedOnEntry := p.closing.Err() != nil
	if closedOnEntry && p.broken != "close-still-grants" {
		return nil, errClosed
	}
	mem := p.srv.mem
	switch p.broken {
	case "grants-never":
		return nil, nil
	case "grants-always":
		if ctx.Err() == nil {
			return noopLease{}, nil
		}
	case "one-lock-for-all-keys":
		key = "the only lock"
	case "nowait-waits":
		if opts.Timeout == tenace.NoWait {
			opts.Timeout = 0
		}
	case "timeout-ignored":
		if opts.Timeout > 0 {
			opts.Timeout = 0
		}
	case "timeout-early":
		opts.Timeout /= 5
	case "clock-ignored":
		opts.Clock = nil // the Timeout on real time
	case "ended-ctx-holds":
		if err := ctx.Err(); err != nil {
			// Takes the key before it looks at ctx, and keeps it.
			_, _ = mem.Acquire(context.Background(), key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
			return nil, err
		}
	case "timeout-waits-whole":
		// Tries again only when the Timeout has passed, not when the key
		// is released.
		if opts.Timeout > 0 {
			if l, err := mem.Acquire(ctx, key, tenace.LockAcquireOptions{Timeout: tenace.NoWait}); l != nil || err != nil {
				return p.lease(key, l, opts.TTL, err)
			}
			// Counted as waiting meanwhile, as a waiter should be.
			p.srv.waiting(1)
			timer := time.NewTimer(opts.Timeout)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
			timer.Stop()
			p.srv.waiting(-1)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			opts.Timeout = tenace.NoWait
		}
	case "ghost-waiter":
		// The wait does not end with ctx: the caller leaves, its place in
		// the queue stays, and takes the key for nobody.
		if opts.Timeout != tenace.NoWait && ctx.Err() == nil {
			type result struct {
				l   tenace.LockLease
				err error
			}
			ch := make(chan result, 1) // one result, never blocks the ghost
			go func() {
				l, err := mem.Acquire(context.WithoutCancel(ctx), key, opts)
				ch <- result{l, err}
			}()
			select {
			case r := <-ch:
				return p.lease(key, r.l, opts.TTL, r.err)
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	case "lifo":
		if opts.Timeout == 0 {
			if err := p.park(ctx, key); err != nil {
				return nil, err
			}
		}
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(p.closing, cancel)
	defer stop()
	if closedOnEntry { // "close-still-grants"
		actx = ctx
	}
	l, err := mem.Acquire(actx, key, opts)
	if !closedOnEntry && p.closing.Err() != nil && ctx.Err() == nil {
		if l != nil {
			_ = l.Release(context.Background())
		}
		if p.broken == "close-strands-waiters" {
			// The waiter is left waiting for ctx.
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return nil, errClosed
	}
	switch p.broken {
	case "timeout-is-error":
		if l == nil && err == nil && opts.Timeout > 0 {
			return nil, context.DeadlineExceeded
		}
	case "cancel-is-nil":
		if errors.Is(err, context.Canceled) {
			return nil, nil
		}
	case "deadline-as-timeout":
		// Takes ctx's deadline for the Timeout.
		if errors.Is(err, context.DeadlineExceeded) && opts.Timeout > 0 {
			return nil, nil
		}
	case "leaks-on-cancel":
		if l == nil && err != nil && ctx.Err() != nil {
			// The give-up leaves the lock to be taken by nobody.
			_, _ = mem.Acquire(context.Background(), key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		}
	case "drops-raced-grant":
		if l != nil {
			// The grant takes a while to come back, as a server's reply
			// does: until ctx ends, at most a second (every grant of the
			// run waits so, the holder's and the free-key checks' too,
			// which takes CancelRacingGrant, the one subtest run with this
			// provider, a few seconds before it fails). A ctx that ended
			// meanwhile drops the grant instead of releasing it. Without
			// the wait the window would be the few instructions between
			// mem's return and the check, which a busy machine misses in 19
			// runs of 20.
			timer := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
			timer.Stop()
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
	case "stats-waiting-stuck":
		if ctx.Err() != nil {
			p.srv.gaveUp.Add(1)
		}
	}
	return p.lease(key, l, opts.TTL, err)
}

// park is "lifo"'s wait: a waiter for a held key waits on top of the key's
// stack, counted in Waiting, until a release pops it.
func (p *refProvider) park(ctx context.Context, key string) error {
	srv := p.srv
	srv.mu.Lock()
	if srv.holders[key] == nil {
		srv.mu.Unlock()
		return nil
	}
	gate := make(chan struct{})
	srv.parked[key] = append(srv.parked[key], gate)
	srv.nParked++
	srv.mu.Unlock()
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		srv.mu.Lock()
		defer srv.mu.Unlock()
		select {
		case <-gate: // popped already
		default:
			stack := srv.parked[key]
			for i, g := range stack {
				if g == gate {
					srv.parked[key] = append(stack[:i:i], stack[i+1:]...)
					srv.nParked--
				}
			}
		}
		return ctx.Err()
	}
}

// waiting counts d waiters outside mem's queue in Stats().Waiting.
func (srv *server) waiting(d int) {
	srv.mu.Lock()
	srv.nParked += d
	srv.mu.Unlock()
}

// unpark lets the top waiter parked on key go.
func (srv *server) unpark(key string) {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if stack := srv.parked[key]; len(stack) > 0 {
		close(stack[len(stack)-1])
		srv.parked[key] = stack[:len(stack)-1]
		srv.nParked--
	}
}

// lease wraps a grant of the server's provider in a refLease.
func (p *refProvider) lease(key string, inner tenace.LockLease, ttl time.Duration, err error) (tenace.LockLease, error) {
	if inner == nil {
		return nil, err
	}
	l := &refLease{p: p, key: key, inner: inner, token: inner.(tenace.FencedLease).Token()}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing.Err() != nil && p.broken != "close-still-grants" {
		_ = inner.Release(context.Background())
		return nil, errClosed
	}
	if p.held == nil {
		p.held = map[*refLease]struct{}{}
	}
	p.held[l] = struct{}{}
	if p.broken == "tokens-restart" {
		if !p.began {
			p.first, p.began = l.token-1, true
		}
		l.token -= p.first
	}
	p.srv.mu.Lock()
	p.srv.holders[key] = l
	p.srv.mu.Unlock()
	if ttl > 0 {
		// Set under p.mu, which end takes to read it.
		switch p.broken {
		case "ttl-ignored":
		case "ttl-early":
			l.timer = time.AfterFunc(ttl/5, func() { l.lose(tenace.ErrLeaseExpired) })
		case "ttl-lost-never-closes":
			l.timer = time.AfterFunc(ttl, func() { l.end() })
		case "ttl-err-not-expired":
			l.timer = time.AfterFunc(ttl, func() { l.lose(tenace.ErrLeaseLost) })
		default:
			l.timer = time.AfterFunc(ttl, func() { l.lose(tenace.ErrLeaseExpired) })
		}
	}
	return l, nil
}

func (p *refProvider) Stats() tenace.LockStats {
	st := p.srv.mem.Stats()
	p.srv.mu.Lock()
	st.Waiting += p.srv.nParked
	p.srv.mu.Unlock()
	st.Waiting += int(p.srv.gaveUp.Load())
	return st
}

// Close fails this value's waiters and later Acquires, and loses the leases
// held through it.
func (p *refProvider) Close() error {
	p.close()
	if p.broken == "close-keeps-leases" {
		return nil
	}
	p.mu.Lock()
	held := make([]*refLease, 0, len(p.held))
	for l := range p.held {
		held = append(held, l)
	}
	p.mu.Unlock()
	for _, l := range held {
		l.lose(fmt.Errorf("%w: the provider was closed", tenace.ErrLeaseLost))
	}
	return nil
}

// refLease is a refProvider's lease: a grant of the server's provider, with
// a token, a TTL, and a lost signal.
type refLease struct {
	tenace.LeaseSignal
	p     *refProvider
	key   string
	inner tenace.LockLease
	token uint64
	timer *time.Timer // the TTL's; guarded by p.mu

	released atomic.Bool // Release was called
	ended    atomic.Bool // the key was freed
}

var (
	_ tenace.FencedLease  = (*refLease)(nil)
	_ tenace.LosableLease = (*refLease)(nil)
)

func (l *refLease) Token() uint64 {
	if l.p.broken == "tokens-repeat" {
		return 1
	}
	return l.token
}

func (l *refLease) Lost() <-chan struct{} {
	if l.p.broken == "lost-new-channel" {
		return make(chan struct{})
	}
	return l.LeaseSignal.Lost()
}

// lose marks the lease lost and frees its key, as a server whose key
// expired or was deleted would.
func (l *refLease) lose(err error) {
	if l.Lose(err) {
		l.end()
	}
}

// end frees the key, once.
func (l *refLease) end() {
	if l.ended.Swap(true) {
		return
	}
	l.p.mu.Lock()
	if l.timer != nil {
		l.timer.Stop()
	}
	delete(l.p.held, l)
	l.p.mu.Unlock()
	srv := l.p.srv
	srv.mu.Lock()
	if srv.holders[l.key] == l {
		delete(srv.holders, l.key)
	}
	srv.mu.Unlock()
	_ = l.inner.Release(context.Background())
	if l.p.broken == "lifo" {
		srv.unpark(l.key)
	}
}

func (l *refLease) Release(ctx context.Context) error {
	switch l.p.broken {
	case "release-noop":
		return nil
	case "lost-on-release":
		l.Lose(errors.New("released"))
	case "release-gives-up":
		// Fails when ctx has ended, and yet counts itself released: the
		// retry does nothing, and the key stays held by nobody.
		if l.released.Swap(true) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		l.end()
		return nil
	}
	if l.released.Swap(true) || l.Err() != nil {
		switch l.p.broken {
		case "second-release-errors":
			return errors.New("released already")
		case "stale-release-frees-holder":
			// Releases the key, whoever holds it now.
			srv := l.p.srv
			srv.mu.Lock()
			h := srv.holders[l.key]
			srv.mu.Unlock()
			if h != nil {
				_ = h.inner.Release(ctx)
			}
			return nil
		}
		if l.Err() == nil {
			return nil
		}
	}
	l.end()
	return nil
}

// noopLease is "grants-always"'s lease: it holds nothing.
type noopLease struct{}

func (noopLease) Release(context.Context) error { return nil }
func (noopLease) Token() uint64                 { return 1 }
