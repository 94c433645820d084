package fuzz

import (
	"context"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"tenace.dev/internal/proptest"
	"tenace.dev/tenace"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// inBubble runs a rapid property on fuzz input inside a synctest bubble.
func inBubble(prop func(*rapid.T)) func(*testing.T, []byte) {
	fuzz := rapid.MakeFuzz(prop)
	return func(t *testing.T, data []byte) {
		synctest.Test(t, func(t *testing.T) { fuzz(t, data) })
	}
}

func FuzzTable(f *testing.F) { f.Fuzz(rapid.MakeFuzz(proptest.TableProperty)) }

func FuzzSharedTable(f *testing.F) { f.Fuzz(rapid.MakeFuzz(proptest.SharedTableProperty)) }

func FuzzProvider(f *testing.F) { f.Fuzz(inBubble(proptest.ProviderProperty)) }

func FuzzPolicy(f *testing.F) { f.Fuzz(inBubble(proptest.PolicyProperty)) }

// FuzzSets reads each input twice: as a schedule of sets (SetProperty),
// and as one of executions nesting Locks on keys and sets, with contexts
// kept past their Lock (ExecutionProperty).
func FuzzSets(f *testing.F) {
	sets, execs := inBubble(proptest.SetProperty), inBubble(proptest.ExecutionProperty)
	f.Fuzz(func(t *testing.T, data []byte) {
		sets(t, data)
		execs(t, data)
	})
}

// TestSmoke is the plain sequential check every mutant must pass (one
// acquire, one release, through the provider and through a policy), so that
// it is the fuzz targets that find a mutant, not a crash at start.
func TestSmoke(t *testing.T) {
	p := tenace.NewMemoryLockProvider()
	defer p.Close()
	ctx := context.Background()
	l, err := p.Acquire(ctx, "k", tenace.LockAcquireOptions{})
	if err != nil || l == nil {
		t.Fatalf("Acquire = %v, %v", l, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ran := false
	err = tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p, Key: "k"}).Execute(ctx, func(context.Context) error {
		ran = true
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Execute = %v, ran %v", err, ran)
	}
}
