package main

import (
	"context"
	"errors"
	"runtime"
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

// impls lists the implementations by name, in the order tables show them.
var impls = []struct {
	name string
	desc string
	make func(shards int) Locker
}{
	{"tenace", "tenace MemoryLockProvider, default shards (GOMAXPROCS)", func(shards int) Locker {
		var opts []tenace.MemoryOption
		if shards > 0 {
			opts = append(opts, tenace.WithShards(shards))
		}
		return &tenaceLocker{p: tenace.NewMemoryLockProvider(opts...)}
	}},
	{"tenace-1shard", "tenace MemoryLockProvider, WithShards(1)", func(int) Locker {
		return &tenaceLocker{p: tenace.NewMemoryLockProvider(tenace.WithShards(1))}
	}},
	{"pipeline", "tenace NewPolicy().WithLock(...) through Execute", func(shards int) Locker {
		var opts []tenace.MemoryOption
		if shards > 0 {
			opts = append(opts, tenace.WithShards(shards))
		}
		p := tenace.NewMemoryLockProvider(opts...)
		return &pipelineLocker{p: p, pol: tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: p})}
	}},
	{"semaphore", "map of x/sync semaphore.Weighted(1), reference counted: FIFO + context", func(int) Locker {
		return &semaphoreLocker{m: map[string]*semEntry{}}
	}},
	{"moby", "github.com/moby/locker: per-key sync.Mutex, no FIFO, no timeout", func(int) Locker {
		return &mobyLocker{l: locker.New()}
	}},
	{"keymutex", "k8s.io/utils/keymutex hashed over GOMAXPROCS mutexes: keys can collide", func(int) Locker {
		return &keymutexLocker{k: keymutex.NewHashed(runtime.GOMAXPROCS(0))}
	}},
}

func makeLocker(name string, shards int) (Locker, bool) {
	for _, i := range impls {
		if i.name == name {
			return i.make(shards), true
		}
	}
	return nil, false
}

// providerLocker is a distributed tenace provider (redislock, pglock)
// behind Locker: acquire with opts, run fn, release.
type providerLocker struct {
	p interface {
		tenace.LockProvider
		Close() error
	}
	opts tenace.LockAcquireOptions
}

func (t *providerLocker) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	l, err := t.p.Acquire(ctx, key, t.opts)
	if err != nil {
		return err
	}
	if l == nil {
		return errors.New("not acquired")
	}
	_ = fn(ctx)
	// As tenace's Lock step releases: neither ctx's cancel nor its
	// deadline may cut the release short, or the key would stay held until
	// its TTL; the provider bounds a release without a deadline itself.
	return l.Release(context.WithoutCancel(ctx))
}
func (t *providerLocker) TakesContext() bool { return true }
func (t *providerLocker) Close()             { _ = t.p.Close() }

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

type pipelineLocker struct {
	p   *tenace.MemoryLockProvider
	pol tenace.Policy
}

func (t *pipelineLocker) Do(ctx context.Context, key string, fn func(context.Context) error) error {
	return t.pol.Execute(ctx, fn, tenace.WithKey(key))
}
func (t *pipelineLocker) TakesContext() bool { return true }
func (t *pipelineLocker) Close()             { _ = t.p.Close() }

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
