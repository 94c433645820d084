package load

import (
	"context"
	"runtime"
	"strings"
	"sync"

	"github.com/moby/locker"
	"golang.org/x/sync/semaphore"
	"k8s.io/utils/keymutex"

	"tenace.dev/tenace"
)

// Locker is the one small interface every implementation is measured
// behind: Do runs fn while holding key, and returns an error when it gave
// up first (ctx's, or the library's own: redsync returns ErrFailed), which
// the load tool counts as a give-up when ctx had ended and fn had not run. fn is made once per goroutine, not per call, so that the
// interface costs no allocation of its own.
type Locker interface {
	Do(ctx context.Context, key string, fn func(context.Context) error) error
	// TakesContext reports whether Do gives up when ctx ends; the cancel
	// scenario runs only for those.
	TakesContext() bool
	Close()
}

// memoryFamily is the in-process implementations, in the order tables
// show them.
func memoryFamily() *Family {
	mem := func(mk func(shards int) Locker) func(string, int, int) (Locker, error) {
		return func(_ string, _, shards int) (Locker, error) { return mk(shards), nil }
	}
	return &Family{Name: "memory", Base: "tenace", Scenarios: strings.Join(defaultScenarios, ","), Goroutines: "1,16,256", Impls: []Impl{
		{Name: "tenace", Desc: "tenace MemoryLockProvider, default shards (GOMAXPROCS)", Gives: tenaceGives, Make: mem(func(shards int) Locker {
			return &tenaceLocker{p: NewMemoryProvider(shards)}
		})},
		{Name: "tenace-1shard", Desc: "tenace MemoryLockProvider, WithShards(1)", Gives: tenaceGives, Make: mem(func(int) Locker {
			return &tenaceLocker{p: tenace.NewMemoryLockProvider(tenace.WithShards(1))}
		})},
		{Name: "pipeline", Desc: "tenace NewPolicy().WithLock(...) through Execute", Gives: tenaceGives, Make: mem(func(shards int) Locker {
			p := NewMemoryProvider(shards)
			return &PipelineLocker{P: p, Policy: tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p})}
		})},
		{Name: "semaphore", Desc: "map of x/sync semaphore.Weighted(1), reference counted: FIFO + context", Gives: []string{givesOrder, givesCancel}, Make: mem(func(int) Locker {
			return &semaphoreLocker{m: map[string]*semEntry{}}
		})},
		{Name: "moby", Desc: "github.com/moby/locker: per-key sync.Mutex, no FIFO, no timeout", Make: mem(func(int) Locker {
			return &mobyLocker{l: locker.New()}
		})},
		{Name: "keymutex", Desc: "k8s.io/utils/keymutex hashed over GOMAXPROCS mutexes: keys can collide", Make: mem(func(int) Locker {
			return &keymutexLocker{k: keymutex.NewHashed(runtime.GOMAXPROCS(0))}
		})},
	}}
}

// tenaceGives is what tenace's in-process rows give their callers.
var tenaceGives = []string{givesOrder, givesCancel, givesFencing}

// NewMemoryProvider is tenace's in-process provider with shards shards (0:
// its default).
func NewMemoryProvider(shards int) *tenace.MemoryLockProvider {
	var opts []tenace.MemoryOption
	if shards > 0 {
		opts = append(opts, tenace.WithShards(shards))
	}
	return tenace.NewMemoryLockProvider(opts...)
}

// MemoryImpls names the in-process implementations, in table order.
func MemoryImpls() []string { return implNames([]*Family{family("memory")}) }

// MakeLocker makes the in-process implementation name with shards shards
// (tenace's; 0: the default). It panics on a name MemoryImpls does not list.
func MakeLocker(name string, shards int) Locker {
	i := family("memory").impl(name)
	if i == nil {
		panic("tenace: bench has no in-process implementation " + name)
	}
	l, _ := i.Make("", 1, shards)
	return l
}

type tenaceLocker struct{ p *tenace.MemoryLockProvider }

func (t *tenaceLocker) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	l, err := t.p.Acquire(ctx, key, tenace.LockAcquireOptions{})
	if err != nil {
		return err
	}
	_ = fn(ctx)
	return l.Release(ctx)
}
func (t *tenaceLocker) TakesContext() bool { return true }
func (t *tenaceLocker) Close()             { _ = t.p.Close() }

// PipelineLocker is a tenace policy with a Lock step on P, through
// Execute.
type PipelineLocker struct {
	P      *tenace.MemoryLockProvider
	Policy tenace.Policy
}

// Do runs fn through the policy, keyed by key.
func (t *PipelineLocker) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	return t.Policy.Execute(ctx, fn, tenace.WithKey(key))
}

// TakesContext is true: Execute gives up when ctx ends.
func (t *PipelineLocker) TakesContext() bool { return true }

// Close closes P.
func (t *PipelineLocker) Close() { _ = t.P.Close() }

// semaphoreLocker is what a Go developer writes for FIFO + context per key:
// a map of weighted semaphores of size 1, reference counted so that idle
// keys are removed, behind one mutex for the map.
type semaphoreLocker struct {
	mu sync.Mutex
	m  map[string]*semEntry
}

type semEntry struct {
	sem  *semaphore.Weighted
	refs int
}

func (s *semaphoreLocker) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	s.mu.Lock()
	e := s.m[key]
	if e == nil {
		e = &semEntry{sem: semaphore.NewWeighted(1)}
		s.m[key] = e
	}
	e.refs++
	s.mu.Unlock()
	err := e.sem.Acquire(ctx, 1)
	if err == nil {
		_ = fn(ctx)
		e.sem.Release(1)
	}
	s.mu.Lock()
	if e.refs--; e.refs == 0 {
		delete(s.m, key)
	}
	s.mu.Unlock()
	return err
}
func (s *semaphoreLocker) TakesContext() bool { return true }
func (s *semaphoreLocker) Close()             {}

type mobyLocker struct{ l *locker.Locker }

func (m *mobyLocker) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	m.l.Lock(key)
	_ = fn(ctx)
	return m.l.Unlock(key)
}
func (m *mobyLocker) TakesContext() bool { return false }
func (m *mobyLocker) Close()             {}

type keymutexLocker struct{ k keymutex.KeyMutex }

func (k *keymutexLocker) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	k.k.LockKey(key)
	_ = fn(ctx)
	return k.k.UnlockKey(key)
}
func (k *keymutexLocker) TakesContext() bool { return false }
func (k *keymutexLocker) Close()             {}
