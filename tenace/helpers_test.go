package tenace_test

import (
	"context"
	"errors"
	"sync"

	"tenace.dev/tenace"
	"tenace.dev/tenace/policy"
)

// fakeProvider is a LockProvider whose answers a test programs, and which
// records what it was asked. It stands in for a provider the tests cannot
// make misbehave on purpose (a failing server, a grant racing a cancel); the
// real providers are tested against themselves.
type fakeProvider struct {
	mu       sync.Mutex
	calls    []fakeCall
	acquire  func(ctx context.Context, key string) (tenace.LockLease, error)
	released []*fakeLease
}

type fakeCall struct {
	key  string
	opts tenace.LockAcquireOptions
}

type fakeLease struct {
	p          *fakeProvider
	releaseErr error
	releaseCtx error // ctx.Err() seen by Release
	releaseDl  bool  // whether Release's ctx had a deadline
	releases   int
	onRelease  func() // if set, runs as Release begins, before it reads ctx
}

func (l *fakeLease) Release(ctx context.Context) error {
	if l.onRelease != nil {
		l.onRelease()
	}
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	l.releases++
	l.releaseCtx = ctx.Err()
	_, l.releaseDl = ctx.Deadline()
	l.p.released = append(l.p.released, l)
	return l.releaseErr
}

func (p *fakeProvider) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	p.mu.Lock()
	p.calls = append(p.calls, fakeCall{key, opts})
	p.mu.Unlock()
	if p.acquire != nil {
		return p.acquire(ctx, key)
	}
	return &fakeLease{p: p}, nil
}

func (p *fakeProvider) lastCall() fakeCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[len(p.calls)-1]
}

func (p *fakeProvider) releaseCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.released)
}

var errBoom = errors.New("boom")

// recorder collects a policy's events.
type recorder struct {
	mu     sync.Mutex
	events []tenace.Event
}

func (r *recorder) on(e tenace.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		out = append(out, e.Name+":"+e.Key)
	}
	return out
}

// step is a strategy that logs when it enters and leaves.
type step struct {
	name string
	log  *[]string
}

func (s step) Run(ctx context.Context, x policy.Execution, next policy.Next) error {
	*s.log = append(*s.log, "enter "+s.name)
	err := next.Run(ctx)
	*s.log = append(*s.log, "leave "+s.name)
	return err
}
