package main

import (
	"context"
	"errors"

	"tenace.dev/tenace"
)

// providerLocker is a distributed tenace provider (redislock, pglock)
// behind load.Locker: acquire with opts, run fn, release.
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
