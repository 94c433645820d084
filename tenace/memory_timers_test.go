package tenace_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"tenace.dev/tenace"
)

// The provider pools its acquire timers. Under GODEBUG=asynctimerchan=1
// (Go's old timers, which a program may still ask for) a timer that fired
// can deliver its tick after Stop and even after a drain: pooled, it made
// a later Acquire of a free key time out at once. The test runs itself
// again with that setting, since GODEBUG is read when the process starts.
func TestPooledTimersNeverTimeOutALaterAcquireUnderTheOldTimers(t *testing.T) {
	if os.Getenv("TENACE_OLD_TIMERS_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPooledTimersNeverTimeOutALaterAcquireUnderTheOldTimers$", "-test.count=1")
		cmd.Env = append(os.Environ(), "TENACE_OLD_TIMERS_CHILD=1", "GODEBUG=asynctimerchan=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("with GODEBUG=asynctimerchan=1: %v\n%s", err, out)
		}
		return
	}
	p := tenace.NewMemoryLockProvider(tenace.WithShards(1))
	defer p.Close()
	ctx := context.Background()
	for i := range 20_000 {
		// A timeout so short that it often fires as the grant is received.
		if l, err := p.Acquire(ctx, "k", tenace.LockAcquireOptions{Timeout: time.Nanosecond}); err != nil {
			t.Fatal(err)
		} else if l != nil {
			_ = l.Release(ctx)
		}
		l, err := p.Acquire(ctx, "k", tenace.LockAcquireOptions{Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if l == nil {
			t.Fatalf("round %d: a free key was not granted within an hour: a pooled timer's stale tick", i)
		}
		_ = l.Release(ctx)
	}
}
