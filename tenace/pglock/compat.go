package pglock

// Stand-ins for the core's provider kit (tenace.ValidateAcquire,
// tenace.AcquireContext, tenace.LeaseSignal, tenace.ErrLeaseLost,
// tenace.ErrLeaseExpired) until it lands on main; this file goes away then.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"tenace.dev/tenace"
)

var (
	errLeaseLost      = errors.New("tenace: the lock's lease was lost before Release")
	errLeaseExpired   = fmt.Errorf("%w: it reached its TTL", errLeaseLost)
	errAcquireTimeout = errors.New("tenace: not acquired within LockAcquireOptions.Timeout")
)

func validateAcquire(key string, opts tenace.LockAcquireOptions) error {
	if key == "" {
		return fmt.Errorf("%w (pglock.Acquire was given an empty key)", tenace.ErrMissingKey)
	}
	if opts.Timeout < 0 && opts.Timeout != tenace.NoWait {
		return fmt.Errorf("%w: LockAcquireOptions.Timeout is %v; use a positive duration, 0 to wait as long as ctx allows, or NoWait", tenace.ErrInvalidOption, opts.Timeout)
	}
	if opts.TTL < 0 {
		return fmt.Errorf("%w: LockAcquireOptions.TTL is %v; use a positive duration, or 0 for the provider's default", tenace.ErrInvalidOption, opts.TTL)
	}
	return nil
}

func acquireContext(ctx context.Context, opts tenace.LockAcquireOptions) (context.Context, context.CancelFunc) {
	if opts.Timeout <= 0 {
		return context.WithCancel(ctx)
	}
	if opts.Clock == nil {
		return context.WithTimeoutCause(ctx, opts.Timeout, errAcquireTimeout)
	}
	c, cancel := context.WithCancelCause(ctx)
	stop := opts.Clock.AfterFunc(opts.Timeout, func() { cancel(errAcquireTimeout) })
	return c, func() { stop(); cancel(context.Canceled) }
}

type leaseSignal struct {
	once sync.Once
	mu   sync.Mutex
	ch   chan struct{}
	err  error
}

func (s *leaseSignal) init() { s.once.Do(func() { s.ch = make(chan struct{}) }) }

func (s *leaseSignal) Lost() <-chan struct{} { s.init(); return s.ch }

func (s *leaseSignal) Err() error { s.mu.Lock(); defer s.mu.Unlock(); return s.err }

func (s *leaseSignal) Lose(err error) bool {
	s.init()
	if !errors.Is(err, errLeaseLost) {
		err = fmt.Errorf("%w: %w", errLeaseLost, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return false
	}
	s.err = err
	close(s.ch)
	return true
}
