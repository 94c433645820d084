package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/keyfmt"
	"tenace.dev/tenace/internal/noreply"
)

// acquireScript: KEYS[1] the lock, KEYS[2] its fencing counter, KEYS[3]
// the void marker of this token; ARGV[1] the token, ARGV[2] the TTL in ms.
//
// Returns {1, fence} when the key is this token's: granted now, or by an
// earlier run of the same acquire whose reply was lost (go-redis retries a
// command whose reply timed out, so a run must be idempotent for its
// token). Returns {0, the holder's PTTL} when another token holds the key,
// and {-1, 0} when this token was voided (see janitor): an acquire given up
// for unknown must never take the key afterwards.
//
// The fencing token is max(counter + 1, the server's TIME in µs): strictly
// above every earlier token of the key while the counter lives, and, after
// a restart that lost the counter, above every token handed out before,
// unless the server's clock went back (the counter runs ahead of the clock
// only while a key is granted more than once a µs).
// Lua numbers are doubles, exact below 2^53 (µs since 1970 are about 2^51),
// and formatted with %.0f, since tostring would round to 14 digits.
var acquireScript = redis.NewScript(`
redis.replicate_commands()
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
	return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
if holder then
	return {0, redis.call('PTTL', KEYS[1])}
end
if redis.call('EXISTS', KEYS[3]) == 1 then
	return {-1, 0}
end
local t = redis.call('TIME')
local fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if last >= fence then
	fence = last + 1
end
redis.call('SET', KEYS[2], string.format('%.0f', fence))
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, fence}
`)

// attempt is one Acquire call: every try of it sends the same token, so
// that a try whose reply was lost and the next one agree, and so that the
// janitor can undo them all at once.
type attempt struct {
	p                               *Provider
	key, lockKey, fenceKey, channel string
	token, voidKey                  string
	pxMS                            int64         // the first expiry Redis is told, whole ms: min(window, TTL)
	ttl                             time.Duration // the cap, whole ms; 0: none
}

func (p *Provider) newAttempt(key string, ttl time.Duration) *attempt {
	var raw [16]byte
	_, _ = rand.Read(raw[:]) // never fails on supported platforms (crypto/rand panics if it does)
	a := &attempt{p: p, key: key, token: hex.EncodeToString(raw[:])}
	a.lockKey, a.fenceKey, a.channel = p.names(key)
	a.voidKey = voidKey(a.lockKey, a.token)
	// Whole milliseconds, rounded down: the lease never promises more than
	// the server keeps.
	a.ttl = ttl.Truncate(time.Millisecond)
	px := p.window
	if a.ttl > 0 && a.ttl < px {
		px = a.ttl
	}
	a.pxMS = px.Milliseconds()
	return a
}

// validate checks what Acquire is given: the kit's checks, and Redis's
// resolution of a millisecond.
func validate(key string, opts tenace.LockAcquireOptions) error {
	if err := tenace.ValidateAcquire(key, opts); err != nil {
		return err
	}
	if opts.Shared {
		return fmt.Errorf("%w: LockAcquireOptions.Shared: redislock does not support shared locks or permits yet; take the key exclusive, or use a tenace.MemoryLockProvider", tenace.ErrInvalidOption)
	}
	if opts.TTL > 0 && opts.TTL < time.Millisecond {
		return fmt.Errorf("%w: LockAcquireOptions.TTL is %v; Redis keeps TTLs in whole milliseconds: use 1ms or more, or 0 for the provider's default", tenace.ErrInvalidOption, opts.TTL)
	}
	return nil
}

// Acquire waits for key and returns its lease: a lease when granted; (nil,
// nil) when not granted within opts.Timeout — the server answered that
// another call holds key and the wait for its release ran out (with
// NoWait, at once on that answer); (nil, ctx's error) when ctx ends first,
// also when it ends during a Redis call; (nil, err) when Redis fails.
//
// An outage is an error, never (nil, nil): a server that refuses
// connections or cannot be reached, or answers with an error, fails the
// call at once, whatever the Timeout (NoWait included), with an error that
// wraps the cause (errors.Is(err, syscall.ECONNREFUSED) holds for a
// refused connection: a try that has had no reply for 5ms dials the
// server itself, on a *redis.Client, rather than wait for go-redis's dial
// retries); and a server reached but silent until the Timeout returns an
// error wrapping ErrNoReply (and tenace.ErrNoReply) that names key and the
// Timeout (`redislock: acquiring "k": no reply from Redis within the 700ms
// Timeout (context deadline exceeded)`). A Lock reports both as a provider
// failure (lock.failed), not as contention (lock.rejected). How a try in
// flight at the Timeout is judged: it has 20ms more (lateReply) for its
// reply, which then decides (a grant is returned; "held" is (nil, nil));
// without one, a first try is ErrNoReply (asked once more, for 10ms, if
// this process itself was starved of CPU for 25ms past that deadline: a
// socket read past its deadline fails even with the reply in the buffer),
// and a retry — the server has already answered "held" — is part of the
// wait, (nil, nil), unless it had gone unanswered for 200ms (the server
// stalled during the wait: ErrNoReply). So on a stalled server Acquire returns within Timeout
// + 20ms and this process's scheduling latency.
//
// opts.Timeout bounds the whole call, Redis calls included: each call gets
// a context that ends at the timeout (a try of the acquire script, 20ms
// after it) and at ctx's end, which go-redis
// honours only on a client with ContextTimeoutEnabled (see CheckClient).
// With an opts.Clock other than the system's, the timeout runs on that
// clock and ends the calls when it fires; their socket deadlines come from
// ctx's deadline alone, which is real time.
// The Pub/Sub connection all waiters share is written without the
// deadline (a timed-out write would make go-redis close that connection):
// its SUBSCRIBE and UNSUBSCRIBE are sent in order by a goroutine of the
// connection. A waiter that subscribes waits for its SUBSCRIBE to be
// written — at once on an open connection; while the connection is being
// opened or, after it broke, opened again, until go-redis has opened it —
// but never past its Timeout or ctx. A waiter that leaves (its Timeout or ctx
// ended, or it got the lock) waits for nothing: its UNSUBSCRIBE, or the
// connection's close, is sent after it returned.
//
// The TTL runs on real time, from just before the grant's script was sent
// (the server's expiry is on its own clock), whatever opts.Clock.
//
// Invalid input: an empty key (an error wrapping tenace.ErrMissingKey), a
// negative Timeout other than NoWait, a negative TTL or one under a
// millisecond (tenace.ErrInvalidOption); a nil ctx panics. On a closed
// provider, an error wrapping tenace.ErrProviderClosed (an Acquire whose
// grant came as the provider was closed returns a lease already lost: see
// Close).
//
// When Acquire returns no lease after a Redis call whose outcome is unknown
// (an error or a deadline after the script was sent), the script may yet
// run, or may have run, and take the key. Acquire then voids its token in
// the background (see Close): once the server answers, the key is freed if
// the script took it, and the script cannot take it later. Until then, the
// key may be held by nobody; at worst, if the provider is closed or gives
// the void up first (see the package doc), for its first expiry,
// min(window, TTL), after the script ran.
func (p *Provider) Acquire(ctx context.Context, key string, opts tenace.LockAcquireOptions) (tenace.LockLease, error) {
	if ctx == nil {
		panic("tenace: redislock.Provider.Acquire: nil context: pass context.Background() or the caller's context")
	}
	if err := validate(key, opts); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.isClosed() {
		return nil, errClosed
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = p.ttl
	}
	w, done := p.waitContexts(ctx, opts)
	defer done()
	l, err := p.acquire(w, p.newAttempt(key, ttl), opts.Timeout == tenace.NoWait)
	if l == nil {
		return nil, err
	}
	return l, nil
}

// waitCtx is one Acquire's contexts: caller is the caller's ctx; acq ends
// with it or at the Timeout, on the options' Clock (tenace.AcquireContext);
// call is what the subscription gets: acq itself on the system clock, whose
// deadline go-redis turns into socket deadlines; with another clock, a
// context with the caller's (real) deadline that ends when acq does. try
// is what each try of the acquire script gets: like call, but it ends
// lateReply after the Timeout (with the caller's ctx, at once), so that a
// try in flight at the Timeout can still bring its reply. timeout is the
// call's Timeout, for the error that says no answer came within it.
type waitCtx struct {
	caller, acq, call, try context.Context
	timeout                time.Duration
}

// lateReply is how long after the Timeout a try in flight may still bring
// its reply, which then decides (a grant, or (nil, nil) on "held"); a try
// without a reply by then is an outage (ErrNoReply). A healthy server
// answers in well under a millisecond, but on a loaded machine the reply
// of a try sent just before the Timeout can be read a few milliseconds
// after it; 20ms covers a Go scheduler's time slice (10ms) twice, and
// keeps Acquire within Timeout + 50ms on a stalled server, the bound the
// package promises, with 30ms for the goroutine to run after it.
const lateReply = 20 * time.Millisecond

// retrySilence is how long a retry (a try after the server answered
// "held" in the same Acquire) may have gone unanswered when the Timeout,
// and lateReply after it, cut it short, and still count as part of the
// wait, (nil, nil): the server did answer within the Timeout that the key
// is held, which is what (nil, nil) says. A retry left unanswered longer
// means the server stalled during the wait: an error wrapping ErrNoReply.
// Waiters retry often (after their subscription is confirmed, on each
// release message, on the fallback timer), and on a loaded machine (2
// cores at load 16-29, two CPU burners, -race) retries in flight at the
// Timeout went unread for more than lateReply, and at 100ms still for
// several acquires in a hundred of a held key: each would have been
// reported as an outage. A first try has no such allowance: the server has
// not answered at all.
const retrySilence = 200 * time.Millisecond

// starvedBy is how late, past a first try's deadline, this process may
// see the try fail and still take the failure as the server's silence.
// Later than that, the process was starved of CPU (a loaded machine, a GC
// pause): the reply may have come in time and been left unread, since a
// socket read past its deadline fails even with the reply in the buffer.
// The try is then asked again once (recheck).
const starvedBy = 25 * time.Millisecond

// starved reports whether a first try that failed with err was cut short
// by its own deadline (lateReply after the Timeout, on the system clock)
// more than starvedBy before this process saw it fail.
func starved(w waitCtx, err error) bool {
	d, ok := w.try.Deadline()
	if !ok || w.caller.Err() != nil {
		return false
	}
	if cd, ok := w.caller.Deadline(); ok && !cd.After(d) {
		return false // the caller's deadline: its error, not a verdict
	}
	var reply redis.Error
	if errors.As(err, &reply) || isDialFailure(err) {
		return false
	}
	return time.Since(d) > starvedBy
}

// recheck runs the attempt's script once more, with half of lateReply for
// its answer (a live server answers in well under a millisecond; the
// bound on a stalled one is already stretched by the starvation): see
// starved.
func (a *attempt) recheck(w waitCtx) (*lease, time.Duration, error) {
	ctx, cancel := context.WithTimeout(w.caller, lateReply/2)
	defer cancel()
	return a.try(ctx)
}

// probeAfter is how long a try may go without a reply before Acquire dials
// the server itself (see Provider.probe): a dial that fails (connection
// refused, no route) ends the try at once with that error, instead of after
// go-redis's own dial retries (about 2s with its defaults).
const probeAfter = 5 * time.Millisecond

// acquire: see waitCtx.
func (p *Provider) acquire(w waitCtx, a *attempt, noWait bool) (*lease, error) {
	l, holderTTL, err := a.try(w.try)
	if err != nil && starved(w, err) {
		// Read too late to tell: ask again, as the same attempt (a grant
		// by the first try is found and returned). A copy of the first
		// try may still run after this one's answer: voided, unless this
		// one was granted.
		if l, holderTTL, err = a.recheck(w); err == nil && l == nil {
			a.p.voids.add(a)
		}
	}
	if err != nil {
		return nil, a.failed(w, err, false)
	}
	if l != nil || noWait {
		return l, nil
	}
	if w.acq.Err() != nil {
		// The reply came after the Timeout (within lateReply) or ctx
		// ended: "held", or ctx's error.
		return nil, a.outcome(w, nil, nil)
	}

	// Subscribe first, then try again: a release between the first try and
	// the subscription would otherwise go unheard. The subscription shares
	// the provider's one Pub/Sub connection.
	sw, err := p.subs.subscribe(w.call, a.channel)
	if errors.Is(err, errClosed) {
		return nil, errClosed
	}
	if err != nil {
		// The server answered the try that the key was held: a Timeout
		// that ends the wait for the subscription ends a wait for a
		// release, (nil, nil).
		return nil, a.outcome(w, fmt.Errorf("redislock: subscribing to the release channel of %s: %w", keyfmt.Quote(a.key), err), nil)
	}
	acquired := false
	defer func() { p.subs.unsubscribe(sw, acquired) }()
	// Until Redis confirms the subscription a release could go unheard, so
	// the confirmation itself means: try again. After it, a release message
	// (or a broken connection, which may have lost one) wakes the waiter,
	// and the fallback timer covers a message lost anyway.
	confirmed := sw.sub.confirmed
	retry := time.NewTimer(p.nextWait(holderTTL))
	defer retry.Stop()
	for {
		select {
		case <-confirmed:
			confirmed = nil
		case <-sw.wake:
		case <-retry.C:
		case <-w.acq.Done():
			return nil, a.outcome(w, nil, nil)
		case <-p.closing:
			return nil, errClosed
		}
		if w.acq.Err() != nil { // ended as another case was chosen
			return nil, a.outcome(w, nil, nil)
		}
		sent := time.Now()
		if l, holderTTL, err = a.try(w.try); err != nil {
			return nil, a.failed(w, err, noreply.Unanswered(w.try, sent) < retrySilence)
		}
		if l != nil {
			acquired = true
			return l, nil
		}
		retry.Reset(p.nextWait(holderTTL))
	}
}

// nextWait is how long a waiter waits before trying again if no release
// message comes: the jittered fallback interval, but never past the
// holder's remaining TTL (holderTTL, from PTTL; negative when the key has
// no TTL or vanished, meaning try again at once).
func (p *Provider) nextWait(holderTTL time.Duration) time.Duration {
	d := p.retry/2 + mrand.N(p.retry/2+1)
	if holderTTL < 0 {
		return 0
	}
	if holderTTL < d {
		return holderTTL + time.Millisecond // just past the expiry
	}
	return d
}

// try runs the acquire script once (go-redis may send it more than once),
// through Provider.probed: a server that refuses connections ends it with
// an *unreachableError, probeAfter after the send unless answered by then.
func (a *attempt) try(ctx context.Context) (*lease, time.Duration, error) {
	var l *lease
	var holderTTL time.Duration
	err := a.p.probed(ctx, func(ctx context.Context) error {
		var err error
		l, holderTTL, err = a.tryOn(ctx)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	return l, holderTTL, nil
}

// tryOn runs the acquire script once with ctx, and reads its reply.
func (a *attempt) tryOn(ctx context.Context) (*lease, time.Duration, error) {
	start := time.Now() // before the send: the local expiry is never after Redis's
	res, err := a.run(ctx)
	if err != nil {
		return nil, 0, err
	}
	if len(res) != 2 {
		return nil, 0, fmt.Errorf("unexpected script reply %v", res)
	}
	switch res[0] {
	case 1:
		return a.p.newLease(a, uint64(res[1]), start), 0, nil
	case 0:
		return nil, time.Duration(res[1]) * time.Millisecond, nil
	default: // voided: only after Acquire returned, so never seen by a live one
		return nil, 0, errors.New("the acquire was voided")
	}
}

// run runs the acquire script once and returns its reply.
func (a *attempt) run(ctx context.Context) ([]int64, error) {
	return acquireScript.Run(ctx, a.p.client, []string{a.lockKey, a.fenceKey, a.voidKey}, a.token, a.pxMS).Int64Slice()
}

// outcomeWait bounds how long outcome waits for a context whose deadline
// has passed to report its end. Its timer fires within microseconds, or as
// soon as the scheduler runs it on a loaded machine (20ms was not enough
// under -race beside other work); the wait ends the moment it does, so the
// bound is only against a context that never reports its deadline.
const outcomeWait = time.Second

// failed handles a try that returned err: the script may have run, or may
// yet run, so the token is voided in the background; then it reports.
//
// The rule: (nil, nil) only when the server answered "held". An error
// reply (a redis.Error) is the server's answer, and a failed dial (the
// server refuses connections or cannot be reached) the proof that there
// is none: both are returned as themselves, at once, whatever the
// Timeout. A try the Timeout (and lateReply after it) cut short is an
// error wrapping ErrNoReply, not (nil, nil), which says another call holds
// the key and which a Lock reports as contention (lock.rejected) rather
// than a failure — unless waiting says it is a retry, after the server
// answered "held", cut short less than retrySilence after it was sent: then
// part of the wait, (nil, nil).
func (a *attempt) failed(w waitCtx, err error, waiting bool) error {
	a.p.voids.add(a)
	var reply redis.Error
	isReply := errors.As(err, &reply)
	if !isReply && !isDialFailure(err) && w.caller.Err() == nil {
		// No answer: before calling it silence, dial (a process starved
		// of CPU may not have run the try's own probe in time). A stalled
		// server's kernel accepts the connection; a dead one refuses it.
		if down := a.p.dialNow(); down != nil {
			err = down
		}
	}
	failure := fmt.Errorf("redislock: acquiring %s: %w", keyfmt.Quote(a.key), err)
	if isReply || isDialFailure(err) {
		return a.outcome(w, failure, failure)
	}
	if waiting {
		return a.outcome(w, failure, nil)
	}
	// err is most often the try's own deadline: quoted, not wrapped, so
	// that errors.Is(err, context.DeadlineExceeded) stays the caller's
	// ctx's (SPEC).
	timedOut := fmt.Errorf("redislock: acquiring %s: %w within the %v Timeout (%v)", keyfmt.Quote(a.key), ErrNoReply, w.timeout, err)
	return a.outcome(w, failure, timedOut)
}

// dialNow runs the provider's probe (if it has one) for at most probeWait,
// and returns an *unreachableError if the dial failed other than by its
// deadline; nil otherwise.
func (p *Provider) dialNow() error {
	if p.probe == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeWait)
	defer cancel()
	if err := p.probe(ctx); err != nil && !isTimeout(err) {
		p.unreachable.Store(true)
		return &unreachableError{err: err}
	}
	return nil
}

// probeWait bounds dialNow: a dial on loopback or a LAN is refused or
// accepted in well under a millisecond.
const probeWait = 10 * time.Millisecond

// unreachableError is a dial to the server that failed (Provider.probe),
// which ended a try: the server refuses connections or cannot be reached.
type unreachableError struct {
	err error
}

func (e *unreachableError) Error() string {
	return "Redis refused the connection or cannot be reached (a dial to it failed: " + e.err.Error() + "); check that it runs and that this process can reach it"
}

func (e *unreachableError) Unwrap() error { return e.err }

// isTimeout reports whether err is a deadline's: the probe's dial cut
// short by the try's deadline says nothing of the server.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// isDialFailure reports whether err is a failed dial: the provider's own
// (unreachableError), or one go-redis returned (a *net.OpError whose Op is
// "dial", as it returns at once once PoolSize dials in a row have failed).
func isDialFailure(err error) bool {
	var down *unreachableError
	var op *net.OpError
	return errors.As(err, &down) || errors.As(err, &op) && op.Op == "dial"
}

// outcome is what Acquire returns when it returns no lease: ctx's error if
// ctx ended; timedOut if the Timeout did (nil when it passed while waiting
// for a release; else the error failed chose); else err.
//
// A deadline and the i/o timeout go-redis sets from it fire on different
// clocks (a timer, the network poller), so a call can fail with an i/o
// timeout a moment before ctx reports its end. Once the deadline has passed
// the context ends within moments: wait for it, so that the caller sees
// ctx's error (or the Timeout's outcome), not an i/o error. (The wait is
// bounded, and the deadlines are the calls' own: real time.)
func (a *attempt) outcome(w waitCtx, err, timedOut error) error {
	awaitDeadline(w.call)
	awaitDeadline(w.caller)
	if err := w.caller.Err(); err != nil {
		return err
	}
	if tenace.TimedOut(w.caller, w.acq) {
		return timedOut
	}
	return err
}

// awaitDeadline waits, for at most outcomeWait, for ctx to report its end
// if its deadline has passed.
func awaitDeadline(ctx context.Context) {
	if d, ok := ctx.Deadline(); !ok || time.Now().Before(d) || ctx.Err() != nil {
		return
	}
	t := time.NewTimer(outcomeWait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
