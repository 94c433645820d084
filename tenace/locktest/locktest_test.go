package locktest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"tenace.dev/tenace"
	"tenace.dev/tenace/locktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The suite must fail a provider that breaks the contract. Each broken
// provider below runs the suite in a child process (a failing suite would
// fail this test), and the test checks that the child failed in the subtest
// that guards the broken rule.
func TestTheSuiteFailsBrokenProviders(t *testing.T) {
	if testing.Short() && os.Getenv("CI") == "" {
		t.Skip("runs the suite in child processes (never skipped with CI set)")
	}
	cases := map[string]string{
		"grants-always":     "MutualExclusion",
		"leaks-on-cancel":   "CancelRacingGrant",
		"timeout-is-error":  "NotGrantedInTime",
		"tokens-repeat":     "FencingTokens",
		"ignores-bad-input": "BadInput",
		"release-gives-up":  "ReleaseRetryable",
	}
	for broken, subtest := range cases {
		t.Run(broken, func(t *testing.T) {
			t.Parallel()
			// Bounded, so that a suite that hangs on a broken provider
			// fails this test instead of stalling the run.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBrokenProvider$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), "LOCKTEST_BROKEN="+broken)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a provider that %s:\n%s", broken, out)
			}
			if want := "--- FAIL: TestBrokenProvider/" + subtest; !strings.Contains(string(out), want) {
				t.Fatalf("the suite did not fail %s for a provider that %s:\n%s", subtest, broken, out)
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
	locktest.Run(t, func(t *testing.T) tenace.LockProvider {
		p := tenace.NewMemoryLockProvider()
		t.Cleanup(func() { _ = p.Close() })
		return &brokenProvider{mem: p, broken: broken}
	}, locktest.Capabilities{Fencing: true, WaitBound: 2 * time.Second})
}

// brokenProvider is a MemoryLockProvider with one rule of the contract
// broken on purpose.
type brokenProvider struct {
	mem    *tenace.MemoryLockProvider
	broken string
}

type fixedTokenLease struct{ tenace.LockLease }

func (fixedTokenLease) Token() uint64 { return 1 }

// givingUpLease fails a Release whose ctx has ended, and yet counts itself
// released: the retry does nothing, and the key stays held by nobody.
type givingUpLease struct {
	tenace.LockLease
	done bool
}

func (l *givingUpLease) Release(ctx context.Context) error {
	if l.done {
		return nil
	}
	l.done = true
	if err := ctx.Err(); err != nil {
		return err
	}
	return l.LockLease.Release(ctx)
}

type noopLease struct{}

func (noopLease) Release(context.Context) error { return nil }
func (noopLease) Token() uint64                 { return 1 }

func (b *brokenProvider) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	switch b.broken {
	case "grants-always":
		if key != "" && ctx.Err() == nil && opts.Timeout >= tenace.NoWait && opts.TTL >= 0 {
			return noopLease{}, nil
		}
	case "ignores-bad-input":
		if key == "" || opts.Timeout < tenace.NoWait || opts.TTL < 0 {
			return nil, nil
		}
	case "tokens-repeat":
		l, err := b.mem.Acquire(ctx, key, opts)
		if l == nil {
			return nil, err
		}
		return fixedTokenLease{l}, nil
	case "timeout-is-error":
		l, err := b.mem.Acquire(ctx, key, opts)
		if l == nil && err == nil && opts.Timeout > 0 {
			return nil, context.DeadlineExceeded
		}
		return l, err
	case "release-gives-up":
		l, err := b.mem.Acquire(ctx, key, opts)
		if l == nil {
			return nil, err
		}
		return &givingUpLease{LockLease: l}, nil
	case "leaks-on-cancel":
		l, err := b.mem.Acquire(ctx, key, opts)
		if l == nil && err != nil && ctx.Err() != nil {
			// The give-up leaves the lock to be taken by nobody.
			_, _ = b.mem.Acquire(context.Background(), key, tenace.LockAcquireOptions{Timeout: tenace.NoWait})
		}
		return l, err
	}
	return b.mem.Acquire(ctx, key, opts)
}
