package tenace

import (
	"context"
	"errors"
	"testing"
)

// TestAcquireErrorOrder: input errors first, then ErrProviderClosed, then
// ctx's error — the order of ValidateAcquire's checks, on an open and a
// closed provider (Acquire compares inline and asks refuse for the error
// only when one fails). (From the review of that change.)
func TestAcquireErrorOrder(t *testing.T) {
	p := NewMemoryLockProvider()
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	open := []struct {
		name string
		key  string
		opts LockAcquireOptions
		ctx  context.Context
		want error
	}{
		{"empty key, cancelled", "", LockAcquireOptions{}, cctx, ErrMissingKey},
		{"bad timeout, cancelled", "k", LockAcquireOptions{Timeout: -5}, cctx, ErrInvalidOption},
		{"bad ttl, cancelled", "k", LockAcquireOptions{TTL: -1}, cctx, ErrInvalidOption},
		{"empty key + bad ttl", "", LockAcquireOptions{TTL: -1}, cctx, ErrMissingKey},
		{"cancelled", "k", LockAcquireOptions{}, cctx, context.Canceled},
		{"nowait cancelled", "k", LockAcquireOptions{Timeout: NoWait}, cctx, context.Canceled},
	}
	for _, c := range open {
		l, err := p.Acquire(c.ctx, c.key, c.opts)
		if l != nil || !errors.Is(err, c.want) {
			t.Errorf("open %s: %v, %v; want %v", c.name, l, err, c.want)
		}
	}
	_ = p.Close()
	closed := []struct {
		name string
		key  string
		opts LockAcquireOptions
		ctx  context.Context
		want error
	}{
		{"empty key", "", LockAcquireOptions{}, cctx, ErrMissingKey},
		{"bad timeout", "k", LockAcquireOptions{Timeout: -5}, context.Background(), ErrInvalidOption},
		{"bad ttl", "k", LockAcquireOptions{TTL: -1}, cctx, ErrInvalidOption},
		{"cancelled", "k", LockAcquireOptions{}, cctx, ErrProviderClosed},
		{"ok", "k", LockAcquireOptions{Timeout: NoWait}, context.Background(), ErrProviderClosed},
	}
	for _, c := range closed {
		l, err := p.Acquire(c.ctx, c.key, c.opts)
		if l != nil || !errors.Is(err, c.want) || (c.want == ErrInvalidOption && errors.Is(err, ErrProviderClosed)) {
			t.Errorf("closed %s: %v, %v; want %v", c.name, l, err, c.want)
		}
	}
}
