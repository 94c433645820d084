package redislock

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace"
)

// ErrLeaseLost is returned by Release when the lock was no longer this
// lease's: its TTL ran out (and perhaps another caller took it). The Lock
// step ignores it, as it ignores every release failure.
var ErrLeaseLost = errors.New("redislock: the lease was lost before Release (its TTL ran out); the lock was not touched")

// ErrContextTimeoutDisabled is returned by CheckClient for a client built
// without ContextTimeoutEnabled: such a client ignores ctx deadlines while
// it waits for a reply, so a stalled server holds Acquire (and Release)
// until the client's ReadTimeout, whatever the Timeout or ctx deadline.
var ErrContextTimeoutDisabled = errors.New("redislock: the go-redis client ignores context deadlines (ContextTimeoutEnabled is false), so on a stalled server Acquire's Timeout and ctx deadline wait for the client's ReadTimeout (3s by default); set ContextTimeoutEnabled: true in the client's options")

// Defaults.
const (
	DefaultTTL           = 30 * time.Second
	DefaultPrefix        = "tenace:lock:"
	DefaultRetryInterval = time.Second
)

// Provider is a tenace.LockProvider on Redis. It is safe for concurrent use;
// create it with New and Close it when done. While callers wait it keeps one
// Pub/Sub connection and one goroutine that reads it; while acquires whose
// outcome is unknown are being undone, one goroutine more; when idle,
// neither.
type Provider struct {
	client redis.UniversalClient
	prefix string
	ttl    time.Duration
	retry  time.Duration
	logger *slog.Logger
	subs   *subscriber // one Pub/Sub connection for every waiter, open while any waits
	voids  *janitor    // undoes acquires whose outcome is unknown

	closeOnce sync.Once
	closing   chan struct{} // closed by Close
}

var _ tenace.LockProvider = (*Provider)(nil)

// Option configures New.
type Option interface{ apply(*Provider) }

type optionFunc func(*Provider)

func (f optionFunc) apply(p *Provider) { f(p) }

// WithTTL sets the default TTL of a lock, used when the call gives none. It
// panics if d is under a millisecond (Redis keeps TTLs in milliseconds).
func WithTTL(d time.Duration) Option {
	if d < time.Millisecond {
		panic("tenace: redislock.WithTTL: the TTL must be at least 1ms")
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

// WithLogger gives the provider a logger for what it cannot return as an
// error: New logs a warning when CheckClient finds fault with the client.
// Without it, the provider logs nothing.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(p *Provider) { p.logger = l })
}

// New returns a provider on client: a *redis.Client, a failover (Sentinel)
// client or a *redis.ClusterClient — the tests run all three against real
// servers. Build the client with ContextTimeoutEnabled: true, or a stalled
// server delays Acquire past its Timeout (see CheckClient; with WithLogger,
// New warns about it). It panics if client is nil.
func New(client redis.UniversalClient, opts ...Option) *Provider {
	if client == nil {
		panic("tenace: redislock.New: nil client")
	}
	p := &Provider{
		client: client, prefix: DefaultPrefix, ttl: DefaultTTL, retry: DefaultRetryInterval,
		subs: newSubscriber(client), closing: make(chan struct{}),
	}
	for _, o := range opts {
		o.apply(p)
	}
	p.voids = newJanitor(p)
	if p.logger != nil {
		if err := CheckClient(client); err != nil {
			p.logger.Warn("redislock: "+err.Error(), "ContextTimeoutEnabled", false)
		}
	}
	return p
}

// CheckClient returns an error wrapping ErrContextTimeoutDisabled if
// client ignores ctx deadlines, which go-redis does unless its options set
// ContextTimeoutEnabled: true. Without it, a command sent to a stalled
// server waits for the client's ReadTimeout (3s by default; forever with
// -1), and an Acquire's Timeout or ctx deadline cannot cut it short. It
// knows *redis.Client (also what NewFailoverClient returns),
// *redis.ClusterClient and *redis.Ring, and returns nil for any other
// client, which it cannot inspect.
func CheckClient(client redis.UniversalClient) error {
	var enabled bool
	switch c := client.(type) {
	case *redis.Client:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		enabled = c.Options().ContextTimeoutEnabled
	default:
		return nil
	}
	if !enabled {
		return fmt.Errorf("%w (client %T)", ErrContextTimeoutDisabled, client)
	}
	return nil
}

// Close stops the provider's background work and refuses later acquires
// (their error wraps tenace.ErrProviderClosed); callers waiting in Acquire
// return that error too. Acquires whose outcome was unknown and are not yet
// undone are left to their TTL. Leases already granted stay valid and can
// be released. Close waits for the provider's goroutines to end and is
// idempotent; it returns nil.
func (p *Provider) Close() error {
	p.closeOnce.Do(func() {
		close(p.closing)
		p.voids.close()
	})
	return nil
}

func (p *Provider) isClosed() bool {
	select {
	case <-p.closing:
		return true
	default:
		return false
	}
}

// errClosed is what Acquire returns on a closed provider.
var errClosed = fmt.Errorf("redislock: %w", tenace.ErrProviderClosed)

// names returns the Redis names of key's lock, fencing counter and release
// channel. The hash tag puts them in one cluster slot.
func (p *Provider) names(key string) (lock, fence, channel string) {
	lock = p.prefix + "{" + key + "}"
	return lock, lock + ":fence", lock + ":released"
}

// voidKey is the marker that keeps token from ever holding lockKey: see
// janitor.
func voidKey(lockKey, token string) string { return lockKey + ":void:" + token }
