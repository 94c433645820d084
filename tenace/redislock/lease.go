package redislock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/keyfmt"
)

// releaseScript: KEYS[1] the lock, KEYS[2] the token's void marker (see
// voidScript); ARGV[1] the grant's token, ARGV[2] the release channel,
// ARGV[3] the marker's life in ms (see minVoidLife). Deletes the lock only
// if it is still this grant's, and marks the token void: an acquire script
// of this token that reaches the server afterwards (a go-redis retry, or a
// copy queued on another connection) takes nothing. A second run — go-redis
// retries a call whose reply timed out, and the caller may call Release
// again — finds the marker and reports the release done: 1 if this token's
// release deleted the lock, 0 if the lock was never deleted by it (expired,
// or another's). A release that finds the lock no longer this grant's
// marks the token void too (unless a marker is there already), so that a
// late copy of the grant's acquire cannot take the key again after a lease
// that lapsed.
var releaseScript = newScript("release", holdsLua+`
if holds(redis.call('GET', KEYS[1]), ARGV[1]) then
	redis.call('DEL', KEYS[1])
	redis.call('SET', KEYS[2], 'released', 'PX', ARGV[3])
	redis.call('PUBLISH', ARGV[2], '1')
	return 1
end
local marker = redis.call('GET', KEYS[2])
if marker == 'released' then
	return 1
end
if not marker then
	redis.call('SET', KEYS[2], 'lapsed', 'PX', ARGV[3])
end
return 0
`)

// renewScript: KEYS[1] the lock; ARGV[1] the grant's token, ARGV[2] the new
// expiry from now, in ms. Extends the lock only if it is still this
// grant's: a renewal never extends a lock that expired and was taken by
// someone else, nor one deleted.
var renewScript = newScript("renew", holdsLua+`
if holds(redis.call('GET', KEYS[1]), ARGV[1]) then
	redis.call('PEXPIRE', KEYS[1], ARGV[2])
	return 1
end
return 0
`)

// sharedRenewScript: KEYS[1] the lock, KEYS[2] the shared holders;
// ARGV[1] the grant's token, ARGV[2] the new expiry from now, in ms.
// renewScript for a shared holder: it re-scores only this holder's own
// member, if it is still there and live, and keeps the lock name and the
// holders alive at least as long (see sharedLua).
var sharedRenewScript = newScript("sharedRenew", `
redis.replicate_commands()
`+sharedLua+`
local ms = now()
local exp = redis.call('ZSCORE', KEYS[2], ARGV[1])
if exp and tonumber(exp) > ms then
	local px = tonumber(ARGV[2])
	redis.call('ZADD', KEYS[2], 'XX', ms + px, ARGV[1])
	if isShared(redis.call('GET', KEYS[1])) then
		extendTo(KEYS[1], ms, ms + px)
	end
	extend(KEYS[2], px)
	return 1
end
return 0
`)

// sharedReleaseScript: KEYS[1] the lock, KEYS[2] the token's void marker,
// KEYS[3] the shared holders; ARGV[1] the grant's token, ARGV[2] the
// release channel, ARGV[3] the marker's life in ms. releaseScript for
// a shared holder: it removes this holder's member, frees the lock name
// with the last holder (else keeps it as long as the latest), marks the
// token released and publishes the release; a second run finds the marker.
var sharedReleaseScript = newScript("sharedRelease", `
redis.replicate_commands()
`+sharedLua+`
if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then
	redis.call('SET', KEYS[2], 'released', 'PX', ARGV[3])
	settle(KEYS[1], KEYS[3], now())
	redis.call('PUBLISH', ARGV[2], '1')
	return 1
end
if redis.call('GET', KEYS[2]) == 'released' then
	return 1
end
return 0
`)

// errProviderClosedLost is the loss of the leases held when their provider
// is closed.
var errProviderClosedLost = fmt.Errorf("%w: redislock: the provider was closed, so the lease is no longer renewed", tenace.ErrLeaseLost)

// leaseState is where a lease is; the zero value is invalid.
type leaseState uint8

const (
	_              leaseState = iota
	stateHeld                 // granted, renewed
	stateReleasing            // Release called: no more renewals; a failed release stays here, retryable
	stateLost                 // lost before Release (Lost is closed)
	stateDone                 // released, or Release called after a loss: Release does nothing more
)

// lease is one grant, kept alive by renewals until Release, its cap (the
// TTL), or a loss.
//
// Renewals are two timers, not a goroutine: renewT fires every renewal
// interval and sends renewScript (from the timer's own goroutine, for the
// length of the call); lossT fires at lossAt, lossMargin before expiry, the
// last expiry the server was told (measured from before that renewal was
// sent), and reports the lease lost unless a renewal moved expiry on. So a
// stalled server, or renewals that fail, end the lease a margin before the
// server can free the key. A lease that is renewed arms lossT when its
// first renewal fires (renewT always fires before lossAt: see
// nextRenewal), not at the grant: a lease released before its first
// renewal, the common case, makes and stops one timer, not two; one
// that is never renewed (its TTL ends within the first expiry) arms lossT
// at the grant.
//
// Concurrency: the fields above mu are set at the grant and never change;
// mu guards the rest. It is held across no server call: Release never
// waits for a renewal, and neither a renewal callback nor Close waits for
// a Release's call (a second Release waits for the first's outcome, on
// released); a renewal that reaches the server after the release finds
// the key gone (or another's) and changes nothing, and its reply is
// ignored. mu is taken before the provider's mu, never after.
// Every armed timer and every timer callback running counts one in the
// provider's bg group, so Close can wait for them.
type lease struct {
	tenace.LeaseSignal
	a     *attempt
	fence uint64
	cap   time.Time // when the TTL is reached; zero: no cap
	keys  []string  // {the lock key}, and the holders of a shared lease, for the renewal script
	token any       // the grant's token, boxed once for the scripts

	mu     sync.Mutex
	state  leaseState
	expiry time.Time   // the last expiry the server was told, from before its send
	lossAt time.Time   // when the lease is reported lost without a renewal: lossMargin before expiry
	final  bool        // expiry is the cap's: no renewal goes further
	renewT *time.Timer // the next renewal; nil if the lease was never to be renewed
	lossT  *time.Timer // fires at lossAt; nil until the first renewal fires (see above)
	unsure bool        // a release call failed: it may have deleted the key

	releasing bool          // a Release's call is in flight
	released  chan struct{} // made by a Release that waits for it; closed when it has its outcome
}

var (
	_ tenace.FencedLease  = (*lease)(nil)
	_ tenace.LosableLease = (*lease)(nil)
)

// newLease registers a grant whose script was sent at sent, and arms its
// timers.
func (p *Provider) newLease(a *attempt, fence uint64, sent time.Time) *lease {
	px := time.Duration(a.pxMS) * time.Millisecond
	l := &lease{a: a, fence: fence, keys: a.keys[:1], token: a.tokenArg, state: stateHeld, expiry: sent.Add(px)}
	if l.token == nil {
		l.token = a.token
	}
	if a.shared {
		l.keys = []string{a.lockKey, a.holdersKey()}
	}
	l.lossAt = l.expiry.Add(-lossMargin(px))
	if a.ttl > 0 {
		l.cap = sent.Add(a.ttl)
		l.final = !l.expiry.Before(l.cap)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed { // Close came while the grant was on the wire; Release still frees the key
		l.state = stateLost
		l.Lose(errProviderClosedLost)
		return l
	}
	p.leases[l] = struct{}{}
	p.held.Add(1)
	if l.a.shared {
		p.sharedHeld.Add(1)
	}
	if l.final {
		l.lossT = l.arm(time.Until(l.lossAt), l.lossFired)
	} else {
		l.renewT = l.arm(l.nextRenewal(), l.renewFired)
	}
	return l
}

// nextRenewal is when to send the next renewal, from now: the renewal
// interval, but no later than halfway to the loss (lossAt). The expiry
// counts from before the last send, so after a slow reply (a stalled
// server, a slow network) less than a window is left, and a renewal one
// interval after the reply could come after it: the lease would be
// reported lost while the server still held the key for it. With l.mu
// held, or before the lease is shared.
func (l *lease) nextRenewal() time.Duration {
	return max(0, min(l.a.p.interval, time.Until(l.lossAt)/2))
}

// lossMargin is how long before the expiry the server was told the lease
// is reported lost, when no renewal moved it on: Redlock's allowance, 1%
// of that expiry's length (px: the window, or what was left of the TTL)
// plus 2ms, for the server's clock running faster than this process's and
// for this process's timers firing late. The expiry itself is measured from
// before the command was sent, so the server frees the key at least
// lossMargin after Lost closes, unless its clock gains more than 1% on
// ours or the timer fires later than the margin (a process paused by GC,
// SIGSTOP or an overloaded machine): fencing tokens cover those. 150ms with
// the default window.
func lossMargin(px time.Duration) time.Duration {
	return px/100 + 2*time.Millisecond
}

// arm starts a timer that runs f after d, counted in the provider's bg
// group until f returns or disarm stops it; f is lossFired or renewFired,
// which give the count back. rearm runs it again after d. With l.mu held,
// and either the provider's mu held while it is not closed, or from a
// timer callback (which holds a count itself), so that bg never goes from
// zero to one during Close's Wait. Timers are made once per lease and
// reset, so a renewal allocates no timer.
func (l *lease) arm(d time.Duration, f func()) *time.Timer {
	l.a.p.bg.Add(1)
	return time.AfterFunc(d, f)
}

// lossFired and renewFired are lossT's and renewT's callbacks: expire and
// renew, then the count arm took.
func (l *lease) lossFired()  { defer l.a.p.bg.Done(); l.expire() }
func (l *lease) renewFired() { defer l.a.p.bg.Done(); l.renew() }

// rearm: see arm; t is a timer from arm.
func (l *lease) rearm(t *time.Timer, d time.Duration) {
	if !t.Reset(d) { // it had fired or was stopped: a new count for the next run
		l.a.p.bg.Add(1)
	}
}

// disarm stops t; if that kept its callback from running, it gives back
// the callback's count. With l.mu held.
func (l *lease) disarm(t *time.Timer) {
	if t != nil && t.Stop() {
		l.a.p.bg.Done()
	}
}

// renew runs when renewT fires: one renewal, then the next one armed, or a
// retry while the window lasts, or the loss if the key is no longer this
// lease's.
func (l *lease) renew() {
	p := l.a.p
	l.mu.Lock()
	if l.state != stateHeld {
		l.mu.Unlock()
		return
	}
	if l.lossT == nil {
		l.lossT = l.arm(time.Until(l.lossAt), l.lossFired)
	}
	sent := time.Now()
	// Whole milliseconds, rounded down, as the acquire's first expiry: the
	// lease never promises more than the server keeps.
	px, final := p.window.Truncate(time.Millisecond), false
	if !l.cap.IsZero() {
		if rest := l.cap.Sub(sent).Truncate(time.Millisecond); rest <= px {
			px, final = rest, true
		}
	}
	if px < time.Millisecond {
		// The cap is less than a millisecond away: the expiry last told is
		// the last one, and lossT reports the cap at it.
		l.final = true
		l.mu.Unlock()
		return
	}
	deadline := l.lossAt // past it the lease is lost anyway
	l.mu.Unlock()

	ctx, cancel := context.WithDeadline(p.stop, deadline)
	script := renewScript
	if l.a.shared {
		script = sharedRenewScript
	}
	n, err := script.Run(ctx, p.client, l.keys, l.token, px.Milliseconds()).Int()
	cancel()

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != stateHeld {
		return // released, lost or closed meanwhile: the reply does not matter
	}
	switch {
	case err != nil:
		// Try again soon, while the window lasts; if none gets through,
		// lossT reports the loss at expiry.
		if retry := max(p.interval/4, time.Millisecond); time.Now().Add(retry).Before(l.lossAt) {
			l.rearm(l.renewT, retry)
		}
	case n == 0:
		l.loseLocked(fmt.Errorf("%w: redislock: a renewal found %s no longer held by this lease (it expired, was deleted, or was taken by another holder)", tenace.ErrLeaseLost, keyfmt.Quote(l.a.key)))
	default:
		if e := sent.Add(px); e.After(l.expiry) {
			l.expiry, l.lossAt, l.final = e, e.Add(-lossMargin(px)), final
			l.rearm(l.lossT, time.Until(l.lossAt))
		}
		if !l.final {
			l.rearm(l.renewT, l.nextRenewal())
		}
	}
}

// expire runs when lossT fires: the lease is lost unless a renewal moved
// its expiry on meanwhile.
func (l *lease) expire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != stateHeld || time.Now().Before(l.lossAt) {
		return
	}
	if l.final {
		l.loseLocked(fmt.Errorf("%w (redislock: %s was held for its TTL, %v)", tenace.ErrLeaseExpired, keyfmt.Quote(l.a.key), l.a.ttl))
		return
	}
	l.loseLocked(fmt.Errorf("%w: redislock: no renewal of %s reached the server before the expiry it was last given; the server may have freed the key", tenace.ErrLeaseLost, keyfmt.Quote(l.a.key)))
}

// lose marks the lease lost with err if it is still held (for Close).
func (l *lease) lose(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == stateHeld {
		l.loseLocked(err)
	}
}

// loseLocked: with l.mu held and the lease held.
func (l *lease) loseLocked(err error) {
	l.state = stateLost
	l.stopLocked()
	l.Lose(err)
}

// stopLocked disarms the timers and takes the lease off the provider's
// books. With l.mu held, once, as the lease leaves stateHeld.
func (l *lease) stopLocked() {
	l.disarm(l.renewT)
	l.disarm(l.lossT)
	p := l.a.p
	p.mu.Lock()
	if _, ok := p.leases[l]; ok {
		delete(p.leases, l)
		p.held.Add(-1)
		if l.a.shared {
			p.sharedHeld.Add(-1)
		}
	}
	p.mu.Unlock()
}

// Release stops the renewals, deletes the lock if it is still this grant's
// and wakes the waiters. It returns nil when it released the lock. A
// release that fails (Redis unreachable, ctx ended) returns the error and
// can be called again (renewals stay stopped: the key lapses within one
// window if no retry gets through). A ctx without a deadline is bounded by
// one window (WithWindow), so that a stalled server cannot hold the caller
// — the Lock step releases with such a ctx — longer than the key can
// outlive the renewals (on a client with ContextTimeoutEnabled; otherwise
// the client's ReadTimeout bounds the call); once one succeeded, Release does
// nothing and returns nil. When the lock was no longer this lease's — lost
// (Lost closed; Release still deletes the key if it is this grant's, and
// if that call fails, says so in its error too and can be called again),
// or found gone or taken — it returns an error wrapping tenace.ErrLeaseLost
// and never touches another holder's lock; a call after a failed one that
// finds the key gone returns nil, since the failed call may have deleted
// it.
func (l *lease) Release(ctx context.Context) error {
	a := l.a
	l.mu.Lock()
	for l.releasing {
		// Another Release's call is on its way: its outcome decides this
		// one's (that call is bounded like any release). The channel is
		// made only here: a lone Release allocates none.
		if l.released == nil {
			l.released = make(chan struct{})
		}
		inFlight := l.released
		l.mu.Unlock()
		select {
		case <-inFlight:
		case <-ctx.Done():
			return fmt.Errorf("redislock: releasing %s: another Release of this lease is in progress, and ctx ended first; call Release again: %w", keyfmt.Quote(a.key), ctx.Err())
		}
		l.mu.Lock()
	}
	lost := false
	switch l.state {
	case stateDone:
		l.mu.Unlock()
		return nil
	case stateHeld:
		l.state = stateReleasing
		l.stopLocked()
	case stateLost:
		// Best effort below: the key may still be this grant's (the
		// provider was closed, or the last renewal's reply was lost).
		lost = true
	}
	// The call goes out without l.mu, so that a renewal callback (which
	// takes it once its call ends) and so Close never wait for a release
	// on a stalled server. Nothing else moves the state meanwhile: the
	// renewals and Close act only on a held lease, and a concurrent
	// Release waits for this one above.
	l.releasing = true
	l.mu.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		// A ctx without a deadline (the Lock step releases with one) is
		// bounded by one window: renewals have stopped, so past it the
		// server lets the key go on its own, and a stalled server must not
		// hold the caller longer. On a client with ContextTimeoutEnabled.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.p.window)
		defer cancel()
	}
	n, err := l.releaseCall(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releasing = false
	if l.released != nil {
		close(l.released) // wakes the Releases that waited for this one
		l.released = nil
	}
	if err != nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	if lost {
		if err != nil {
			// The key may still be this grant's (after Close, say): the
			// lease stays lost, so that Release can try again.
			return fmt.Errorf("redislock: releasing %s: %w; deleting its key failed too, so it may stay held (for at most one window); call Release again: %w", keyfmt.Quote(a.key), l.Err(), err)
		}
		l.state = stateDone
		return fmt.Errorf("redislock: releasing %s: %w", keyfmt.Quote(a.key), l.Err())
	}
	if err != nil {
		l.unsure = true
		return fmt.Errorf("redislock: releasing %s failed, so the lock may still be held (for at most one window); call Release again: %w", keyfmt.Quote(a.key), err)
	}
	l.state = stateDone
	if n == 0 && !l.unsure {
		return fmt.Errorf("redislock: releasing %s: the lock was no longer this lease's (it expired, was deleted or taken over): %w", keyfmt.Quote(a.key), tenace.ErrLeaseLost)
	}
	return nil
}

// releaseCall runs releaseScript once for l.
func (l *lease) releaseCall(ctx context.Context) (int, error) {
	a := l.a
	if a.shared {
		return sharedReleaseScript.Run(ctx, a.p.client, []string{a.lockKey, a.voidKey(), a.holdersKey()}, l.token, a.channel(), a.p.voidArg).Int()
	}
	argv := releaseScript.call(2, 3)
	if a.argv != nil { // the lock's and the void marker's names, boxed by the acquire's call
		argv = append(argv, a.argv[3], a.argv[4])
	} else {
		argv = append(argv, a.lockKey, a.voidKey())
	}
	argv = append(argv, l.token, a.channel(), a.p.voidArg)
	return releaseScript.run(ctx, a.p.client, argv).Int()
}

// Token is the grant's fencing token (see the package doc).
func (l *lease) Token() uint64 { return l.fence }

// Expiry is the last expiry the server was told, measured from just before
// that acquire or renewal was sent, in whole milliseconds as Redis keeps
// it: no later than the server's own. Without a renewal past it, Lost
// closes a margin before it (1% of that expiry's length + 2ms).
func (l *lease) Expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiry
}
