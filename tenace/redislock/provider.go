package redislock

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/noreply"
	"tenace.dev/tenace/internal/provkit"
)

// ErrLeaseLost is tenace.ErrLeaseLost: a lease's Err wraps it once the
// lease is lost, and Release wraps it when the lock was no longer this
// lease's (lost, expired, or taken over); the Lock step ignores release
// errors.
var ErrLeaseLost = tenace.ErrLeaseLost

// ErrContextTimeoutDisabled is returned by CheckClient for a client built
// without ContextTimeoutEnabled: such a client ignores ctx deadlines while
// it waits for a reply, so a stalled server holds Acquire (and Release)
// until the client's ReadTimeout, whatever the Timeout or ctx deadline.
var ErrContextTimeoutDisabled = errors.New("redislock: the go-redis client ignores context deadlines, so a stalled server holds Acquire past its Timeout until ReadTimeout; set ContextTimeoutEnabled: true in the client's options")

// Defaults.
const (
	// DefaultTTL: no cap; a lease is held, renewed, until Release or until
	// its holder stops renewing (it dies, or loses the server).
	DefaultTTL = time.Duration(0)
	// DefaultWindow is how long the server keeps a lease after its last
	// renewal: a holder that dies frees the key within it.
	DefaultWindow = 15 * time.Second
	// DefaultPrefix namespaces the keys.
	DefaultPrefix = "tenace:lock:"
	// DefaultRetryInterval is a waiter's fallback retry, if a release
	// message is lost.
	DefaultRetryInterval = time.Second
)

// Provider is a tenace.LockProvider on Redis. It is safe for concurrent use;
// create it with New and Close it when done.
//
// Goroutines: while callers wait, two for the shared Pub/Sub connection
// (one reads it, one sends its SUBSCRIBEs and UNSUBSCRIBEs), which end once
// the last waiter has left and the connection is closed; while acquires
// whose outcome is unknown are being undone, one runs the voids; while a
// lease's renewal is on the wire, one per renewal (renewals are timers,
// not goroutines, between calls). When idle, none.
type Provider struct {
	client   redis.UniversalClient
	prefix   string
	ttl      time.Duration
	window   time.Duration
	interval time.Duration // renewal interval; 0 until New settles it
	retry    time.Duration
	voidMS   int64 // a void marker's life in ms: max(window, minVoidLife, retrySpan)
	// voidArg, markArg and windowArg are voidMS, markLife and the window
	// in ms, boxed once for the scripts' arguments.
	voidArg, markArg, windowArg any
	logger                      *slog.Logger
	owner                       string                      // recorded with every grant (WithOwner)
	ownerArg                    any                         // owner, boxed once for the acquire script's arguments
	subs                        *subscriber                 // one Pub/Sub connection for every waiter, open while any waits
	probe                       func(context.Context) error // dials the server, past go-redis's pool and retries; nil: unknown client
	// unreachable: the last try ended on a failed dial (Provider.probe), so
	// tries dial first, and a failed dial ends them probeAfter after the
	// send unless answered, until one gets through (attempt.try).
	unreachable atomic.Bool
	voids       *janitor // undoes acquires whose outcome is unknown
	dog         watchdog // runs probe for the calls in flight (see probed)

	stop context.Context // ends at Close: bounds background calls
	halt context.CancelFunc
	bg   sync.WaitGroup // renewal timers armed and renewal calls in flight
	held atomic.Int64   // leases granted and not yet released or lost
	// sharedHeld: those of held that are shared (a reader's, a bulkhead's)
	sharedHeld atomic.Int64

	mu      sync.Mutex // guards leases and closed; taken after a lease's mu, never before
	leases  map[*lease]struct{}
	closed  bool
	closing chan struct{} // closed by Close
}

var (
	_ tenace.LockProvider       = (*Provider)(nil)
	_ tenace.StatsProvider      = (*Provider)(nil)
	_ tenace.SharedLockProvider = (*Provider)(nil)
)

// Option configures New.
type Option interface{ apply(*Provider) }

type optionFunc func(*Provider)

func (f optionFunc) apply(p *Provider) { f(p) }

// WithTTL sets the default TTL of a lock — the longest it is held, renewals
// included — used when the call gives none. Without it a lease has no cap
// (DefaultTTL). It panics if d is under a millisecond (Redis keeps TTLs in
// milliseconds).
func WithTTL(d time.Duration) Option {
	return optionFunc(provkit.Duration(d, time.Millisecond, "redislock.WithTTL: the TTL must be at least 1ms", func(p *Provider, d time.Duration) { p.ttl = d }))
}

// WithWindow sets how long the server keeps a lease past its last renewal
// (DefaultWindow): a holder that dies or loses the server frees the key
// within one window, and a lease whose renewals fail is reported lost at
// the end of the window it was last given. Shorter windows free the keys of
// dead holders sooner and cost more renewals. It panics if d is under a
// millisecond.
func WithWindow(d time.Duration) Option {
	return optionFunc(provkit.Duration(d, time.Millisecond, "redislock.WithWindow: the window must be at least 1ms", func(p *Provider, d time.Duration) { p.window = d }))
}

// WithRenewInterval sets how often a held lease is renewed; by default a
// third of the window, so that two renewals in a row can fail before the
// lease is lost. New panics if it is not below the window; WithRenewInterval
// panics if d is not positive.
func WithRenewInterval(d time.Duration) Option {
	return optionFunc(provkit.Duration(d, time.Nanosecond, "redislock.WithRenewInterval: the interval must be positive", func(p *Provider, d time.Duration) { p.interval = d }))
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
	return optionFunc(provkit.Duration(d, time.Nanosecond, "redislock.WithRetryInterval: the interval must be positive", func(p *Provider, d time.Duration) { p.retry = d }))
}

// WithLogger gives the provider a logger for what it cannot return as an
// error: New logs a warning when CheckClient finds fault with the client,
// and the provider one when it gives up voiding an acquire whose outcome
// was unknown (see the package doc), with the key and the last error.
// Without it, the provider logs nothing.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(p *Provider) { p.logger = l })
}

// New returns a provider on client: a *redis.Client, a failover (Sentinel)
// client or a *redis.ClusterClient — the tests run all three against real
// servers. Build the client with ContextTimeoutEnabled: true, or a stalled
// server delays Acquire past its Timeout (see CheckClient; with WithLogger,
// New warns about it). It panics if client is nil, or a nil pointer such as
// (*redis.Client)(nil).
func New(client redis.UniversalClient, opts ...Option) *Provider {
	if isNil(client) {
		panic("tenace: redislock.New: nil client")
	}
	p := &Provider{
		client: client, prefix: DefaultPrefix, ttl: DefaultTTL, window: DefaultWindow, retry: DefaultRetryInterval,
		subs: newSubscriber(client), closing: make(chan struct{}), leases: map[*lease]struct{}{},
	}
	for _, o := range opts {
		o.apply(p)
	}
	if p.interval == 0 {
		p.interval = p.window / 3
	}
	if p.owner == "" {
		p.owner = tenace.DefaultOwner()
	}
	p.ownerArg = p.owner
	if p.interval >= p.window {
		panic(fmt.Sprintf("tenace: redislock.New: the renewal interval (%v) must be below the window (%v)", p.interval, p.window))
	}
	p.voidMS = max(p.window, minVoidLife, retrySpan(client)).Milliseconds()
	p.voidArg, p.markArg, p.windowArg = p.voidMS, p.markLife().Milliseconds(), p.window.Milliseconds()
	p.probe = prober(client)
	p.dog.probe = p.probe
	p.stop, p.halt = context.WithCancel(context.Background())
	p.voids = newJanitor(p)
	if p.logger != nil {
		if err := CheckClient(client); err != nil {
			p.logger.Warn(err.Error(), "ContextTimeoutEnabled", false)
		}
	}
	return p
}

// isNil reports whether client is nil, or a nil pointer (or other nil
// value) in the interface, such as a (*redis.Client)(nil): a client == nil
// check misses those, and New would panic later with a bare nil
// dereference.
func isNil(client redis.UniversalClient) bool {
	if client == nil {
		return true
	}
	switch v := reflect.ValueOf(client); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return v.IsNil()
	default:
		return false
	}
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

// retrySpan bounds how long after a call's first send go-redis may still
// send a copy of it, from the client's options: it sends a copy only after
// the previous send's read timed out, and waits a backoff between them, so
// sends × ReadTimeout + the backoffs between them (a copy sent last may
// then take up to a read timeout to run). A cluster client's redirects and
// its nodes' retries multiply. 0 for a client it cannot inspect, or whose
// reads never time out: nothing to bound, and minVoidLife stands.
func retrySpan(client redis.UniversalClient) time.Duration {
	var sends int
	var read, backoff time.Duration
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		sends, read, backoff = o.MaxRetries+1, o.ReadTimeout, o.MaxRetryBackoff
	case *redis.ClusterClient:
		o := c.Options()
		sends, read, backoff = (o.MaxRedirects+1)*(max(o.MaxRetries, 0)+1), o.ReadTimeout, o.MaxRetryBackoff
	case *redis.Ring:
		o := c.Options()
		sends, read, backoff = o.MaxRetries+1, o.ReadTimeout, o.MaxRetryBackoff
	default:
		return 0
	}
	if read <= 0 || sends < 1 {
		return 0
	}
	return time.Duration(sends)*read + time.Duration(sends-1)*max(backoff, 0)
}

// prober returns a function that dials the server a *redis.Client (also a
// failover client) talks to, with the client's own Dialer but not through
// its pool, its hooks or its dial retries, and closes the connection: it
// returns the dial's error, or nil. A try that has gone probeAfter without
// a reply runs it, so that a server that refuses connections fails the
// try at once rather than after go-redis's retries (DialerRetries ×
// DialerRetryTimeout for each of MaxRetries+1 sends: about 2s with the
// defaults). nil for other clients (a Cluster or a Ring: which node to
// dial depends on the key, and finding it may itself wait on the dead
// node), whose tries see go-redis's own error, or the Timeout's end.
func prober(client redis.UniversalClient) func(context.Context) error {
	c, ok := client.(*redis.Client)
	if !ok {
		return nil
	}
	o := c.Options()
	dial, network, addr, timeout := o.Dialer, o.Network, o.Addr, o.DialTimeout
	if dial == nil {
		return nil
	}
	return func(ctx context.Context) error {
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		cn, err := dial(ctx, network, addr)
		if err != nil {
			return err
		}
		_ = cn.Close()
		return nil
	}
}

// Close stops the provider's background work and refuses later acquires
// (their error wraps tenace.ErrProviderClosed); callers waiting in Acquire
// return that error too, but one whose acquire script was on its way and
// took the key gets its lease, lost already, as a lease held at Close.
// Leases held stop being renewed and are lost at
// once (their Err says the provider was closed; a Lock ends its fn's
// context); their keys stay held until Release, which still deletes them,
// or for at most one window. Acquires whose outcome was unknown and are not
// yet undone are left to their first window (or TTL). Close waits for the
// provider's goroutines to end, and is idempotent; it returns nil. It does
// not wait for a Release in progress. A renewal or void call in flight on
// a server that does not answer ends at its deadline, not at once: go-redis
// ends a call when its context's deadline passes (on a client with
// ContextTimeoutEnabled; else at its ReadTimeout), not when the context is
// cancelled. A renewal's deadline is the lease's expiry, at most one window
// away; a void call's, one second. Close also closes the shared Pub/Sub
// connection and waits for its goroutines, and for those of connections
// closed earlier (when their last waiter left): at once, unless go-redis is
// opening or re-opening one on a server that does not answer; that holds
// its close for up to the client's DialTimeout and ReadTimeout (5s and 3s
// by default; with a ReadTimeout of -1, until the server answers).
func (p *Provider) Close() error {
	if !provkit.EndHeld(&p.mu, &p.closed, p.leases, func() { close(p.closing) }, func(l *lease) { l.lose(errProviderClosedLost) }) {
		return nil
	}
	p.halt()
	p.subs.close()
	p.voids.close()
	p.bg.Wait()
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

// Stats reports the leases held through this provider (granted, not yet
// released nor lost), and the callers of this provider waiting in this
// process (past their first try, subscribed to a release channel): all of
// them, and the most for one key. Five atomic loads.
//
// A shared lease (LockAcquireOptions.Shared) counts as one in Held, as an
// exclusive one does: Held is leases, not permits; and a shared waiter as
// one in Waiting. By mode: SharedKeys and SharedHolders are both the shared
// leases among Held (a lease is one key held shared, and one permit in use,
// through this provider), SharedWaiting the shared callers among Waiting. A lease leaves Held before its Lost closes, and when Release is called,
// before its call to the server and whatever its outcome (after a failed
// Release the key may stay held, for one window at most); a lease granted
// as Close ran, lost at once, never counts.
func (p *Provider) Stats() tenace.LockStats {
	return tenace.LockStats{
		Held:         int(p.held.Load()),
		Waiting:      int(p.subs.nWaiting.Load()),
		LongestQueue: int(p.subs.nLongest.Load()),
		// Held counts leases: a shared lease is a key held shared, and
		// one permit in use, through this provider.
		SharedKeys:    int(p.sharedHeld.Load()),
		SharedHolders: int(p.sharedHeld.Load()),
		SharedWaiting: int(p.subs.nShared.Load()),
	}
}

// ErrNoReply is wrapped by the error Acquire returns when the server was
// reached but left a try unanswered past the Timeout (and noreply.LateReply,
// 20ms, after it): a stalled server, not a held key (which is (nil, nil)). It
// wraps tenace.ErrNoReply, so errors.Is(err, tenace.ErrNoReply) holds too. A
// Lock reports it as a provider failure (*tenace.UnexpectedError, event
// lock.failed). The cause is in the message, not wrapped: it is most often
// the try's own deadline, a context.DeadlineExceeded, which errors.Is keeps
// for the caller's ctx.
var ErrNoReply error = noreply.Error("no reply from Redis")

// errClosed is what Acquire returns on a closed provider.
var errClosed = fmt.Errorf("%w (redislock.Provider.Close was called)", tenace.ErrProviderClosed)

// names returns the Redis names of key's lock, fencing counter and release
// channel. Every name of a key (these, and the void markers voidKey derives
// from the lock name) is the lock name and a suffix, so they share its hash
// tag and land in one cluster slot, where the scripts need them.
//
// A key is normally named prefix + "{" + key + "}": the hash tag is key up
// to its first "}". A key that starts with "}" would give "{}", an empty
// tag, which Redis ignores: it would hash each whole name, and on a cluster
// the lock and its counter would land in different slots (CROSSSLOT on
// every call). Such keys get prefix + "}{" + h + "}" + key + "}" instead,
// where h is the key's 64-bit FNV-1a hash in 16 hex digits: the tag is h,
// so such keys spread over the slots as others do.
//
// No two keys share a name. Each scheme alone is a fixed string (in the
// second, "}{", 16 hex digits and "}": fixed in length), the key, and "}"
// then a suffix; the suffixes (":fence", ":released", ":void:" and a hex
// token, ":holders", ":writers") contain no "}", so the "}" that ends the key's part is the last
// one in the name, and the key is recovered by cutting it there. Across
// the schemes: the prefix has no braces (WithPrefix), so a name's prefix
// ends at its first brace, and that brace is "{" in every ordinary name and
// "}" in every name of a key starting with "}". The ordinary names are
// those of earlier versions, so a process running one of them still
// excludes this one on every key that does not start with "}".
func (p *Provider) names(key string) (lock, fence, channel string) {
	lock = p.lockName(key)
	return lock, lock + fenceSuffix, lock + channelSuffix
}

// lockName is key's lock name (see names).
func (p *Provider) lockName(key string) string {
	if strings.HasPrefix(key, "}") {
		h := fnv.New64a()
		_, _ = h.Write([]byte(key))
		return fmt.Sprintf("%s}{%016x}%s}", p.prefix, h.Sum64(), key)
	}
	return p.prefix + "{" + key + "}"
}

// The suffixes of the names beside a key's lock name (see names).
const (
	fenceSuffix   = ":fence"    // the fencing counter
	channelSuffix = ":released" // the release channel
	voidSuffix    = ":void:"    // and a token: that token's void marker (see janitor)
	holdersSuffix = ":holders"  // the shared holders
	writersSuffix = ":writers"  // the writers waiting
)
