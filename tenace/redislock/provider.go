// Package redislock is a tenace.LockProvider on a Redis server, for locks
// that must hold across processes and machines.
//
//	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	locks := redislock.New(client)
//	p := tenace.NewPolicy().WithLock(tenace.LockOptions{Provider: locks, Key: "reports", TTL: time.Minute})
//	err := p.Execute(ctx, buildReport)
//
// # How it works
//
// Acquire runs one Lua script: SET key token NX PX ttl with a random token
// (128 bits from crypto/rand) per grant and, when the SET succeeds, INCR of
// the key's fencing counter, whose new value is the lease's fencing token.
// A caller that must wait subscribes to the key's release channel first,
// then tries again, so no release is missed between the two; each release
// publishes on that channel, which wakes the provider's oldest waiter of the
// key to try again at once (one release, one lock: waking them all would
// only make the rest lose).
// All waiters of a Provider share one Pub/Sub connection, open while anyone
// waits. In case a message is lost (a reconnect, say) a waiter also retries after a
// jittered fallback interval, and never waits past the holder's remaining
// TTL, its own Timeout or its context without trying again. Release runs one
// script that deletes the key only if it still holds this grant's token, and
// publishes the release.
//
// The lock key is prefix + "{" + key + "}" and its counter the same plus
// ":fence": the hash tag puts both in one slot, so the scripts work on a
// Redis Cluster; the prefix must not contain braces.
//
// # Defaults
//
//	TTL            30s  (WithTTL; per call, tenace.LockOptions.TTL)
//	prefix         "tenace:lock:" (WithPrefix)
//	fallback retry 1s, jittered between half and all of it (WithRetryInterval)
//
// # Guarantees and their limits
//
//   - Mutual exclusion holds while a single Redis primary is the authority:
//     standalone, or the primary of a failover (sentinel) group, or the
//     primary of the key's slot in a cluster.
//   - Failover can lose a lock: Redis replicates asynchronously, so a
//     primary that fails after granting and before replicating hands a
//     replica the role without the key, and a second caller can be granted
//     the same lock. Fencing tokens are the defence.
//   - Expiry: a holder that runs longer than its TTL loses the lock without
//     knowing it from Redis. Leases implement tenace.ExpiringLease with an
//     expiry taken before the acquire was sent, so that the Lock step ends
//     fn's context no later than Redis expires the key (clocks drifting
//     apart aside); Release after expiry returns ErrLeaseLost and never
//     touches another holder's lock.
//   - Fencing tokens: each grant's token is the key's counter, strictly
//     increasing across grants and clients. A resource that records the
//     highest token it has accepted and refuses lower ones stays safe even
//     when a paused or expired holder writes late. The counters are kept (an
//     expiring counter would restart and break monotonicity): one small
//     string key, about 70 bytes, per lock key ever used.
//   - Not FIFO: waiters in different processes race for the key when it is
//     released; in each process the oldest waiter tries again on the release
//     message, and the first script to run wins. Within one process waiters
//     are woken roughly in arrival order (a newcomer's first try can still
//     take a free key); for strict FIFO inside a process put a Lock on the
//     MemoryLockProvider in front of this one.
//   - Errors: a Redis command that fails returns its error at once (through
//     a Lock, an *tenace.UnexpectedError); nothing retries silently.
package redislock

import (
	"context"
	rand2 "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace"
	"tenace.dev/tenace/policy"
)

// ErrLeaseLost is returned by Release when the lock was no longer this
// lease's: its TTL ran out (and perhaps another caller took it). The Lock
// step ignores it, as it ignores every release failure.
var ErrLeaseLost = errors.New("redislock: the lease was lost before Release (its TTL ran out); the lock was not touched")

// Defaults.
const (
	DefaultTTL           = 30 * time.Second
	DefaultPrefix        = "tenace:lock:"
	DefaultRetryInterval = time.Second
)

// Provider is a tenace.LockProvider on Redis. It is safe for concurrent use;
// create it with New. While callers wait it keeps one Pub/Sub connection and
// one goroutine that reads it; when nobody waits, neither.
type Provider struct {
	client redis.UniversalClient
	prefix string
	ttl    time.Duration
	retry  time.Duration
	subs   *subscriber // one Pub/Sub connection for every waiter, open while any waits
}

var _ tenace.LockProvider = (*Provider)(nil)

// Option configures New.
type Option interface{ apply(*Provider) }

type optionFunc func(*Provider)

func (f optionFunc) apply(p *Provider) { f(p) }

// WithTTL sets the default TTL of a lock, used when the call gives none. It
// panics if d is not positive.
func WithTTL(d time.Duration) Option {
	if d <= 0 {
		panic("tenace: redislock.WithTTL: the TTL must be positive")
	}
	return optionFunc(func(p *Provider) { p.ttl = d })
}

// WithPrefix sets the namespace of the lock keys. It panics if prefix
// contains a brace, which would break the keys' hash tag.
func WithPrefix(prefix string) Option {
	if strings.ContainsAny(prefix, "{}") {
		panic("tenace: redislock.WithPrefix: the prefix must not contain braces")
	}
	return optionFunc(func(p *Provider) { p.prefix = prefix })
}

// WithRetryInterval sets the fallback retry of a waiter, used only if a
// release message is lost: a waiter retries after a random wait between
// half and all of d. It panics if d is not positive.
func WithRetryInterval(d time.Duration) Option {
	if d <= 0 {
		panic("tenace: redislock.WithRetryInterval: the interval must be positive")
	}
	return optionFunc(func(p *Provider) { p.retry = d })
}

// New returns a provider on client: a *redis.Client, a failover (Sentinel)
// client or a *redis.ClusterClient — the tests run all three against real
// servers. It panics if client is nil.
func New(client redis.UniversalClient, opts ...Option) *Provider {
	if client == nil {
		panic("tenace: redislock.New: nil client")
	}
	p := &Provider{client: client, prefix: DefaultPrefix, ttl: DefaultTTL, retry: DefaultRetryInterval, subs: newSubscriber(client)}
	for _, o := range opts {
		o.apply(p)
	}
	return p
}

// acquireScript: KEYS[1] the lock, KEYS[2] its fencing counter; ARGV[1] the
// grant's token, ARGV[2] the TTL in ms. Returns {1, fence} when granted, or
// {0, the holder's remaining TTL in ms (PTTL)}.
var acquireScript = redis.NewScript(`
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
	return {1, redis.call('INCR', KEYS[2])}
end
return {0, redis.call('PTTL', KEYS[1])}
`)

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

func (p *Provider) names(key string) (lock, fence, channel string) {
	lock = p.prefix + "{" + key + "}"
	return lock, lock + ":fence", lock + ":released"
}

// Acquire waits for key and returns its lease: a lease when granted; (nil,
// nil) when not granted within opts.Timeout (at once with NoWait); (nil,
// ctx's error) when ctx ends first; (nil, err) when Redis fails, at once.
// An empty key is the only invalid one (an error wrapping
// tenace.ErrMissingKey), with a negative Timeout other than NoWait or a
// negative TTL (tenace.ErrInvalidOption).
func (p *Provider) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	if key == "" {
		return nil, fmt.Errorf("%w (redislock.Acquire was given an empty key)", tenace.ErrMissingKey)
	}
	if opts.Timeout < 0 && opts.Timeout != tenace.NoWait {
		return nil, fmt.Errorf("%w: LockAcquireOptions.Timeout is %v; use a positive duration, 0 to wait as long as ctx allows, or NoWait", tenace.ErrInvalidOption, opts.Timeout)
	}
	if opts.TTL < 0 {
		return nil, fmt.Errorf("%w: LockAcquireOptions.TTL is %v; use a positive duration, or 0 for the provider's default", tenace.ErrInvalidOption, opts.TTL)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = p.ttl
	}
	lockKey, fenceKey, channel := p.names(key)
	l, _, err := p.try(ctx, key, lockKey, fenceKey, channel, ttl)
	if err != nil || l != nil || opts.Timeout == tenace.NoWait {
		return asLease(l), err
	}

	var timeout <-chan time.Time
	if opts.Timeout > 0 {
		if policy.IsSystemClock(opts.Clock) {
			t := time.NewTimer(opts.Timeout)
			defer t.Stop()
			timeout = t.C
		} else {
			ch := make(chan time.Time, 1)
			stop := opts.Clock.AfterFunc(opts.Timeout, func() { ch <- time.Time{} })
			defer stop()
			timeout = ch
		}
	}

	// Subscribe first, then try again: a release between the first try and
	// the subscription would otherwise go unheard. The subscription shares
	// the provider's one Pub/Sub connection.
	w, err := p.subs.subscribe(ctx, channel)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("redislock: subscribing to the release channel of %q: %w", key, err)
	}
	acquired := false
	defer func() { p.subs.unsubscribe(w, acquired) }()
	// Until Redis confirms the subscription a release could go unheard, so
	// every wake-up (a message, a broken connection) means: try again.
	confirmed := w.sub.confirmed
	for confirmed != nil {
		select {
		case <-confirmed:
			confirmed = nil
		case <-w.wake:
			if l, _, err = p.try(ctx, key, lockKey, fenceKey, channel, ttl); err != nil || l != nil {
				acquired = l != nil
				return asLease(l), err
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timeout:
			return nil, nil
		}
	}
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		var holderTTL time.Duration
		if l, holderTTL, err = p.try(ctx, key, lockKey, fenceKey, channel, ttl); err != nil || l != nil {
			acquired = l != nil
			return asLease(l), err
		}
		retry.Reset(p.nextWait(holderTTL))
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timeout:
			return nil, nil
		case <-w.wake: // a release, or a broken connection: try again
		case <-retry.C:
		}
	}
}

// asLease keeps a nil *lease from becoming a non-nil interface.
func asLease(l *lease) tenace.LockLease {
	if l == nil {
		return nil
	}
	return l
}

// nextWait is how long a waiter waits before trying again if no release
// message comes: the jittered fallback interval, but never past the
// holder's remaining TTL (holderTTL, from PTTL; negative when the key has
// no TTL or vanished, meaning try again at once).
func (p *Provider) nextWait(holderTTL time.Duration) time.Duration {
	d := p.retry/2 + rand.N(p.retry/2+1)
	if holderTTL < 0 {
		return 0
	}
	if holderTTL < d {
		return holderTTL + time.Millisecond // just past the expiry
	}
	return d
}

// try runs the acquire script once.
func (p *Provider) try(ctx context.Context, key, lockKey, fenceKey, channel string, ttl time.Duration) (*lease, time.Duration, error) {
	var raw [16]byte
	_, _ = cryptorand(raw[:])
	token := hex.EncodeToString(raw[:])
	start := time.Now() // before the send: the local expiry is never after Redis's
	res, err := acquireScript.Run(ctx, p.client, []string{lockKey, fenceKey}, token, ttl.Milliseconds()).Int64Slice()
	if err != nil {
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		return nil, 0, fmt.Errorf("redislock: acquiring %q: %w", key, err)
	}
	if len(res) != 2 {
		return nil, 0, fmt.Errorf("redislock: acquiring %q: unexpected script reply %v", key, res)
	}
	if res[0] == 0 {
		return nil, time.Duration(res[1]) * time.Millisecond, nil
	}
	return &lease{p: p, key: key, lockKey: lockKey, channel: channel, token: token, fence: uint64(res[1]), expiry: start.Add(ttl)}, 0, nil
}

// cryptorand fills b from crypto/rand, which never fails on supported
// platforms (and panics inside crypto/rand if it ever does).
func cryptorand(b []byte) (int, error) { return rand2.Read(b) }

// lease is one grant.
type lease struct {
	p        *Provider
	key      string
	lockKey  string
	channel  string
	token    string
	fence    uint64
	expiry   time.Time
	released atomic.Bool
}

var (
	_ tenace.FencedLease   = (*lease)(nil)
	_ tenace.ExpiringLease = (*lease)(nil)
)

// Release deletes the lock if it is still this grant's and wakes the
// waiters. A second call does nothing and returns nil; after the TTL ran
// out it returns ErrLeaseLost and leaves whoever holds the key now alone.
func (l *lease) Release(ctx context.Context) error {
	if l.released.Swap(true) {
		return nil
	}
	n, err := releaseScript.Run(ctx, l.p.client, []string{l.lockKey}, l.token, l.channel).Int()
	if err != nil {
		return fmt.Errorf("redislock: releasing %q: %w", l.key, err)
	}
	if n == 0 {
		return ErrLeaseLost
	}
	return nil
}

// Token is the grant's fencing token: the key's counter after this grant.
func (l *lease) Token() uint64 { return l.fence }

// Expiry is when the lock lapses unless released first, measured from just
// before the acquire was sent, so no later than Redis's own expiry.
func (l *lease) Expiry() time.Time { return l.expiry }
