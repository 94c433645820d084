package redislock

import (
	"context"
	"errors"

	"tenace.dev/tenace"
	"tenace.dev/tenace/policy"
)

var errAcquireTimeout = errors.New("redislock: the acquire timed out")

// acquireContext returns a context that ends when ctx ends or when
// opts.Timeout passes on opts.Clock (for Timeout 0 or NoWait it only
// follows ctx). With the system clock it carries a real deadline, which
// go-redis can honour on the network.
func acquireContext(ctx context.Context, opts tenace.LockAcquireOptions) (context.Context, context.CancelFunc) {
	if opts.Timeout <= 0 {
		return context.WithCancel(ctx)
	}
	if policy.IsSystemClock(opts.Clock) {
		return context.WithTimeoutCause(ctx, opts.Timeout, errAcquireTimeout)
	}
	actx, cancel := context.WithCancelCause(ctx)
	stop := opts.Clock.AfterFunc(opts.Timeout, func() { cancel(errAcquireTimeout) })
	return actx, func() { stop(); cancel(context.Canceled) }
}
