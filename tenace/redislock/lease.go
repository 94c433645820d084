package redislock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace"
)

// releaseScript: KEYS[1] the lock; ARGV[1] the grant's token, ARGV[2] the
// release channel. Deletes the lock only if it is still this grant's.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
	redis.call('DEL', KEYS[1])
	redis.call('PUBLISH', ARGV[2], '1')
	return 1
end
return 0
`)

// leaseState is where a lease is; the zero value is invalid.
type leaseState uint8

const (
	_         leaseState = iota
	stateHeld            // granted, not released
	stateDone            // released, or found lost by Release: Release does nothing more
)

// lease is one grant.
//
// Concurrency: the fields above mu are set at the grant and never change;
// mu guards state and unsure, and is held across the release script so that
// two Release calls do not race each other.
type lease struct {
	a      *attempt
	fence  uint64
	expiry time.Time

	mu     sync.Mutex
	state  leaseState
	unsure bool // a release call failed: it may have deleted the key
}

var (
	_ tenace.FencedLease   = (*lease)(nil)
	_ tenace.ExpiringLease = (*lease)(nil)
)

func newLease(a *attempt, fence uint64, sent time.Time) *lease {
	return &lease{a: a, fence: fence, expiry: sent.Add(a.ttl), state: stateHeld}
}

// Release deletes the lock if it is still this grant's and wakes the
// waiters. A release that fails (Redis unreachable, ctx ended) returns the
// error and can be called again; once one succeeded, Release does nothing
// and returns nil. After the TTL ran out it returns ErrLeaseLost and leaves
// whoever holds the key now alone — except after a failed call, which may
// have deleted the key itself: a later call that finds the key gone then
// returns nil.
func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == stateDone {
		return nil
	}
	a := l.a
	n, err := releaseScript.Run(ctx, a.p.client, []string{a.lockKey}, a.token, a.channel).Int()
	if err != nil {
		l.unsure = true
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fmt.Errorf("redislock: releasing %q failed, so the lock may still be held (until its TTL); call Release again: %w", a.key, err)
	}
	l.state = stateDone
	if n == 0 && !l.unsure {
		return ErrLeaseLost
	}
	return nil
}

// Token is the grant's fencing token (see the package doc).
func (l *lease) Token() uint64 { return l.fence }

// Expiry is when the lock lapses unless released first, measured from just
// before the acquire was sent with the TTL in whole milliseconds, so no
// later than Redis's own expiry.
func (l *lease) Expiry() time.Time { return l.expiry }
