package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace"
	"tenace.dev/tenace/internal/keyfmt"
	"tenace.dev/tenace/internal/noreply"
)

// sharedLua is the Lua the scripts that touch shared holders begin with.
//
// A key held shared has its lock name set to sharedPrefix and the key's
// permit count ("shared:5"; "shared:0" for any number), which never equals
// a grant token (32 hex digits): so an exclusive caller, a set, and a
// process running a version before shared locks all see the key held, and
// none of them touches it. The holders are a sorted set (holdersKey) whose
// members are grant tokens and scores their expiry in ms on the server's
// clock; the lock name's own expiry is kept at the latest of them, set as
// that absolute time (PXAT, PEXPIREAT) from the same TIME reading, never
// relative to the clock the server runs a script on, so that it outlives
// every live holder: a script that finds no lock name knows that no holder
// is live (the exclusive caller's grant reads no holders), and the name is
// deleted with the last one.
//
// It begins with fenceLua (clock(), nextFence). now() is the server's
// TIME in ms (a script reads TIME once: the fence and the expiries come
// from the same reading); prune(h, now) drops the holders of
// sorted set h that expired; settle(lock, h, now) deletes lock and h once h
// has no live holder, else sets lock's expiry to the latest holder's;
// extend(k, px) makes k live at least px ms more; extendTo(k, ms, at)
// makes k live at least until the absolute time at (ms is now()): never
// shorter than it was, since ms + PTTL is at or after k's expiry.
const sharedLua = fenceLua + sharedOnlyLua

// sharedOnlyLua is sharedLua without fenceLua: the acquire script's own
// fast path needs fenceLua alone.
const sharedOnlyLua = `
local function now()
	local us = clock()
	return math.floor(us / 1000)
end
local function prune(h, ms)
	redis.call('ZREMRANGEBYSCORE', h, '-inf', ms)
end
local function isShared(v)
	return v and string.sub(v, 1, 7) == 'shared:'
end
local function settle(lock, h, ms)
	prune(h, ms)
	local last = redis.call('ZRANGE', h, -1, -1, 'WITHSCORES')
	local v = redis.call('GET', lock)
	if #last == 0 then
		if isShared(v) then
			redis.call('DEL', lock)
		end
		redis.call('DEL', h)
	elseif isShared(v) then
		redis.call('PEXPIREAT', lock, last[2])
	end
end
local function extend(k, px)
	local ttl = redis.call('PTTL', k)
	if ttl < px then
		redis.call('PEXPIRE', k, px)
	end
end
local function extendTo(k, ms, at)
	local ttl = redis.call('PTTL', k)
	if ttl >= 0 and ms + ttl > at then
		at = ms + ttl
	end
	redis.call('PEXPIREAT', k, at)
end
`

// fenceLua is the fencing rule, in the one place every script that grants
// a key takes it from: clock() is the server's TIME, as µs (a number) and
// as the decimal strings of its µs and ms; nextFence(k, us, s) advances
// the fencing counter k and returns the new token, as a number and a
// decimal string (us and s: clock()'s µs);
// owned(mode, ms, fence, owner) is a grant's owner record (see parseOwned),
// from the strings of its ms and its token.
//
// The fencing token is max(counter + 1, the server's TIME in µs): strictly
// above every earlier token of the key while the counter lives, and, after
// a restart that lost the counter or its last increments (no persistence,
// or a snapshot older than the last grants), above every token handed out
// before, unless the server's clock went back: every token is at most the
// clock's reading when it was handed out (the counter runs ahead of the
// clock only while a key is granted more than once a µs), so the clock,
// read at each grant, carries the order across the loss. So TIME is read
// at every grant, not only when the counter is missing: a counter restored
// from an old snapshot is there, and behind.
// The counter is read and written in one command (SET … GET writes the
// clock's reading and returns the previous token); only when that token
// is at or past the clock is it written again, as its successor.
// Lua numbers are doubles, exact below 2^53 (µs since 1970 are about 2^51).
// The strings are cut from TIME's own (seconds, and µs padded to six
// digits), which costs the server less than formatting a number (Lua's
// string.format or a number given to redis.call: C's printf of a double);
// only the counter's successor, in the rare grant that needs it, is
// formatted, with %.0f, since tostring would round to 14 digits.
const fenceLua = `
local function clock()
	local t = redis.call('TIME')
	local u = string.sub('00000' .. t[2], -6)
	return tonumber(t[1]) * 1000000 + tonumber(t[2]), t[1] .. u, t[1] .. string.sub(u, 1, 3)
end
local function nextFence(k, us, s)
	local last = tonumber(redis.call('SET', k, s, 'GET') or '0')
	if last < us then
		return us, s
	end
	s = string.format('%.0f', last + 1)
	redis.call('SET', k, s)
	return last + 1, s
end
local function owned(mode, ms, fence, owner)
	return mode .. ' ' .. ms .. ' ' .. fence .. ' ' .. owner
end
`

// holdsLua is holds(v, token): whether a lock's value v (false: no lock)
// is token's grant. An exclusive grant's value is its token, a space and
// its owner record (see parseOwned): one write keeps both, and the scripts
// that compare a holder's token read the token up to that space. A value
// that is the token alone is a grant of a version that kept the record
// apart, in the owners hash (ownersSuffix).
const holdsLua = `
local function holds(v, token)
	return v == token or v and string.sub(v, 1, #token + 1) == token .. ' '
end
`

// acquireScript: KEYS[1] the lock, KEYS[2] the void marker of this token,
// KEYS[3] its fencing counter, KEYS[4] the shared holders, KEYS[5] the
// writers waiting, KEYS[6] the owners (ownersSuffix); ARGV[1] the token,
// ARGV[2] the first expiry in ms, ARGV[3] the grant's owner label, ARGV[4]
// "1" for a shared caller, ARGV[5] its permit count, ARGV[6] the life in ms
// of an exclusive waiter's mark (0: it does not mark), ARGV[7] a void
// marker's life in ms, ARGV[8] "1" when an earlier try of the same Acquire
// may have marked the key (an exclusive caller's grant then takes its mark
// off the writers waiting; a try with none before it that could have
// marked has none to take: a copy of it that go-redis sent again after a
// lost reply, and which marked the first time, leaves its mark to lapse,
// as a try whose reply was lost does). A grant records its owner (see
// parseOwned): an exclusive one in the lock's value, after its token (see
// holdsLua), a shared one in the owners; a refusal returns, fourth, the
// owner record of the holder it saw (nil when that grant has none). Every
// name the script reads or writes is a declared key: while a Cluster
// migrates the key's slot, Redis redirects the script or asks it to try
// again by its declared keys only, rather than run it where some of them
// are already gone (a void marker missing there would let a voided token
// take the key). The release script takes the first two (attempt.keys).
//
// Returns {1, fence} when the key is this token's: granted now, or by an
// earlier run of the same acquire whose reply was lost (go-redis retries a
// command whose reply timed out, so a run must be idempotent for its
// token). Returns {0, ms} when it is not, ms being how long until a holder
// expires (the holder's PTTL, or the first shared holder's); {0, ms, 1}
// when a shared caller was refused because a writer waits, and {0, ms, 2}
// when an exclusive caller was refused by shared holders and marked the
// key (the third element is 0 otherwise); {-1, 0} when this token was
// voided (see janitor): an acquire given up for unknown must never take
// the key afterwards.
//
// An exclusive caller is granted only if nobody holds the key, shared or
// not; when shared holders refuse it and it marks (ARGV[6] > 0), it adds
// itself to the writers waiting, and a shared caller is refused while any
// is there (see the package doc, Fairness). A shared caller is granted if no exclusive
// holder holds the key, no writer waits, and its live holders are fewer
// than the key's count (the first holder's ARGV[5]; 0: no limit). A shared
// grant is a member of the holders and a marker, in the token's void
// marker, that keeps its fencing token for a retry of the same acquire.
// The fencing token follows fenceLua's rule.
//
// The common case comes first and reads only what it needs: an exclusive
// caller that finds no lock name (so no holder, shared or not: see
// sharedLua) checks its void marker and is granted, without the holders'
// functions or reads. An exclusive caller's first try runs
// acquireFirstScript instead, which is that case alone.
var acquireScript = newScript("acquire", acquireLua)

// grantLua is grantExclusive(us, s, ms): the exclusive grant of the
// acquire scripts, KEYS[1] to ARGV[1] with the expiry ARGV[2] and the
// owner label ARGV[3], its token from the counter KEYS[3] (us, s, ms: the
// clock, see fenceLua). It returns the fencing token.
const grantLua = `
local function grantExclusive(us, s, ms)
	local fence, f = nextFence(KEYS[3], us, s)
	redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. owned('x', ms, f, ARGV[3]), 'PX', ARGV[2])
	return fence
end
`

// acquireLua is acquireScript's source.
const acquireLua = `
redis.replicate_commands()
` + fenceLua + holdsLua + grantLua + `
local voidKey, fenceKey, holders, writers, owners = KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local holder = redis.call('GET', KEYS[1])
if holds(holder, ARGV[1]) then
	return {1, tonumber(redis.call('GET', fenceKey) or '0')}
end
local shared = ARGV[4] == '1'
local function grantWriter(us, s, ms)
	local fence = grantExclusive(us, s, ms)
	if ARGV[8] == '1' then
		redis.call('ZREM', writers, ARGV[1])
	end
	return {1, fence}
end
if not holder and not shared then
	if redis.call('EXISTS', voidKey) == 1 then
		return {-1, 0}
	end
	return grantWriter(clock())
end
` + sharedOnlyLua + `
if holder and not isShared(holder) then
	local sp = string.find(holder, ' ', 1, true)
	local by
	if sp then
		by = string.sub(holder, sp + 1)
	else
		by = redis.call('HGET', owners, holder)
	end
	return {0, redis.call('PTTL', KEYS[1]), 0, by}
end
local us, usS, msS = clock()
local ms = math.floor(us / 1000)
local void = redis.call('GET', voidKey)
if shared and void and string.sub(void, 1, 5) == 'held:' then
	local exp = redis.call('ZSCORE', holders, ARGV[1])
	if exp and tonumber(exp) > ms then
		return {1, tonumber(string.sub(void, 6))}
	end
	void = nil
end
local live = 0
if holder or shared and redis.call('EXISTS', holders) == 1 then
	prune(holders, ms)
	live = redis.call('ZCARD', holders)
	if live == 0 then
		redis.call('DEL', holders)
		if holder then
			redis.call('DEL', KEYS[1])
			holder = nil
		end
	end
end
if void then
	return {-1, 0}
end
local function firstExpiry()
	local e = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
	return tonumber(e[2]) - ms, redis.call('HGET', owners, e[1])
end
if not shared then
	if live > 0 then
		if tonumber(ARGV[6]) > 0 then
			redis.call('ZADD', writers, ms + tonumber(ARGV[6]), ARGV[1])
			extend(writers, tonumber(ARGV[6]))
			local px, by = firstExpiry()
			return {0, px, 2, by}
		end
		local px, by = firstExpiry()
		return {0, px, 0, by}
	end
	return grantWriter(us, usS, msS)
end
if redis.call('EXISTS', writers) == 1 then
	prune(writers, ms)
	local w = redis.call('ZRANGE', writers, 0, 0, 'WITHSCORES')
	if #w > 0 then
		return {0, tonumber(w[2]) - ms, 1}
	end
end
local count = ARGV[5]
if holder then
	count = string.sub(holder, 8)
end
if tonumber(count) > 0 and live >= tonumber(count) then
	local px, by = firstExpiry()
	return {0, px, 0, by}
end
local fence, fenceS = nextFence(fenceKey, us, usS)
local px = tonumber(ARGV[2])
redis.call('ZADD', holders, ms + px, ARGV[1])
if redis.call('HLEN', owners) > 2 * live + 8 then
	for _, t in ipairs(redis.call('HKEYS', owners)) do
		if not redis.call('ZSCORE', holders, t) then
			redis.call('HDEL', owners, t)
		end
	end
end
redis.call('HSET', owners, ARGV[1], owned('s' .. count, msS, fenceS, ARGV[3]))
redis.call('SET', voidKey, 'held:' .. fenceS, 'PX', ARGV[7])
if holder then
	extendTo(KEYS[1], ms, ms + px)
else
	redis.call('SET', KEYS[1], 'shared:' .. count, 'PXAT', ms + px)
end
extend(holders, px)
return {1, fence}
`

// acquireFirstScript is an exclusive caller's first try: acquireScript's
// common case alone, with the first three of its keys (the lock, the void
// marker, the fencing counter) and of its arguments (the token, the first
// expiry, the owner label), which is what that case touches and reads. It
// returns what acquireScript returns for an exclusive caller that finds no
// lock (a grant, or {-1, 0}: voided), that finds the key its own (a copy
// of this try that go-redis sent again), or that an exclusive grant of
// this version refuses ({0, ms, 0, owner record}), except that a grant is
// its fencing token alone, an integer (an array reply costs the server a
// table and its conversion); anything else (shared
// holders, whom an exclusive waiter may mark, or an exclusive record kept
// apart in the owners by an earlier version) is {-2, 0}: run acquireScript
// with every key at once. A first try has no earlier try that could have
// marked the key, so it has no mark to take off either.
var acquireFirstScript = newScript("acquire", acquireFirstLua)

// acquireFirstLua is acquireFirstScript's source.
const acquireFirstLua = `
redis.replicate_commands()
` + fenceLua + holdsLua + grantLua + `
local holder = redis.call('GET', KEYS[1])
if not holder then
	if redis.call('EXISTS', KEYS[2]) == 1 then
		return {-1, 0}
	end
	return grantExclusive(clock())
end
if holds(holder, ARGV[1]) then
	return tonumber(redis.call('GET', KEYS[3]) or '0')
end
local sp = string.find(holder, ' ', 1, true)
if sp then
	return {0, redis.call('PTTL', KEYS[1]), 0, string.sub(holder, sp + 1)}
end
return {-2, 0}
`

// attempt is one Acquire call: every try of it sends the same token, so
// that a try whose reply was lost and the next one agree, and so that the
// janitor can undo them all at once.
type attempt struct {
	p                   *Provider
	key, lockKey, token string
	pxMS                int64         // the first expiry Redis is told, whole ms: min(window, TTL)
	ttl                 time.Duration // the cap, whole ms; 0: none
	shared              bool          // a shared caller: one of the key's permits
	permits             int           // with shared: the key's count (0: no limit)
	markMS              int64         // an exclusive waiter's mark life in ms (see markLife); 0: it does not mark
	marked              bool          // a try of this exclusive caller marked the key (see unmark)
	owner               any           // the grant's owner: the provider's label, and the caller's (ownerOf)
	heldBy              any           // the holder's owner record the last refusal returned (see parseOwned); nil: none
	heldTTL             int64         // with heldBy: the holder's TTL in ms that refusal returned
	keys                []string      // the acquire script's keys (see acquireScript), in names
	names               [7]string     // keys, then the release channel
	argv                []any         // the acquire script's call (see script.call), made by the first try: acquireFirstScript's if first
	first               bool          // argv is acquireFirstScript's call
	tokenArg            any           // token, boxed once for the scripts (nil until a call is made)
}

func (p *Provider) newAttempt(key string, ttl time.Duration) *attempt {
	a := &attempt{p: p, key: key}
	a.setNames(p.lockName(key))
	a.keys = a.names[:6]
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

// setNames draws a's token and sets its names: the lock (lock), the
// token's void marker, the fencing counter, the shared holders, the
// writers waiting, the owners, and the release channel (see names), all
// cut from one string: a name is the lock name and a suffix, so each is a
// prefix of a stretch of lock name + suffix.
func (a *attempt) setNames(lock string) {
	var raw [16]byte
	var token [32]byte
	_, _ = rand.Read(raw[:]) // never fails on supported platforms (crypto/rand panics if it does)
	hex.Encode(token[:], raw[:])
	suffixes := [...]string{voidSuffix, fenceSuffix, holdersSuffix, writersSuffix, ownersSuffix, channelSuffix}
	var b strings.Builder
	b.Grow(len(suffixes)*len(lock) + len(voidSuffix) + len(token) + len(fenceSuffix) + len(holdersSuffix) + len(writersSuffix) + len(ownersSuffix) + len(channelSuffix))
	for i, suffix := range suffixes {
		b.WriteString(lock)
		b.WriteString(suffix)
		if i == 0 {
			b.Write(token[:])
		}
	}
	all := b.String()
	a.lockKey, a.names[0] = all[:len(lock)], all[:len(lock)]
	at := 0
	for i, suffix := range suffixes {
		n := len(lock) + len(suffix)
		if i == 0 {
			n += len(token)
			a.token = all[n-len(token) : n]
		}
		a.names[1+i] = all[at : at+n]
		at += n
	}
}

// The names beside the attempt's lock name (see names).
func (a *attempt) voidKey() string    { return a.names[1] }
func (a *attempt) fenceKey() string   { return a.names[2] }
func (a *attempt) holdersKey() string { return a.names[3] }
func (a *attempt) writersKey() string { return a.names[4] }
func (a *attempt) channel() string    { return a.names[6] }

// markLife is how long a waiting writer's mark lasts past its last try
// (see the package doc, Fairness): three fallback retry intervals, a
// waiter trying at least once an interval, and at least minMarkLife, so
// that a try or two delayed on a loaded machine does not let it lapse. A
// writer that dies while it waits holds back new shared callers that long.
func (p *Provider) markLife() time.Duration {
	return max(3*p.retry, minMarkLife)
}

// minMarkLife: see markLife.
const minMarkLife = 250 * time.Millisecond

// unmark takes a's mark off the writers waiting, in the background: a
// writer that gives up must not hold back shared callers for the rest of
// its mark's life. (A try whose reply was lost may have marked unseen:
// that mark lapses on its own.) The script publishes on the key's release
// channel when it took a mark off, so that a reader the mark held back —
// in any process — tries again at once rather than at its fallback
// interval. Bounded by the mark's life (the mark is gone by then anyway);
// a failure is left to that life.
func (p *Provider) unmark(a *attempt) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return // the marks lapse on their own
	}
	p.bg.Add(1)
	go func() {
		defer p.bg.Done()
		ctx, cancel := context.WithTimeout(p.stop, time.Duration(a.markMS)*time.Millisecond)
		defer cancel()
		_ = unmarkScript.Run(ctx, p.client, []string{a.writersKey()}, a.token, a.channel()).Err()
	}()
}

// unmarkScript takes a waiting writer's mark (ARGV[1]) off the key's
// writers (KEYS[1]) and, if it was there, publishes on the key's release
// channel (ARGV[2]).
var unmarkScript = newScript("unmark", `
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
	redis.call('PUBLISH', ARGV[2], '1')
end
return 0
`)

// validate checks what Acquire is given: the kit's checks, and Redis's
// resolution of a millisecond (validTTL).
func validate(key string, opts tenace.LockAcquireOptions) error {
	if err := tenace.ValidateAcquire(key, opts); err != nil {
		return err
	}
	return validTTL(opts)
}

// validTTL refuses a TTL under a millisecond, which Redis cannot keep; the
// kit's checks (tenace.ValidateAcquire, ValidateSet) come first.
func validTTL(opts tenace.LockAcquireOptions) error {
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
// With opts.Shared the lease is one of key's permits (opts.Permits: 0 for
// any number, a read/write lock; N for at most N holders, a keyed
// bulkhead), granted beside other shared holders and never beside an
// exclusive one; without it, the whole key. An exclusive caller that
// waits for shared holders holds back new shared callers of key until it
// is granted or gives up (see the package doc, Fairness between readers
// and writers). Everything below holds for both.
//
// An outage is an error, never (nil, nil): a server that refuses connections
// or cannot be reached, or answers with an error, fails the call at once,
// whatever the Timeout (NoWait included), with an error that wraps the cause
// (errors.Is(err, syscall.ECONNREFUSED) holds for a refused connection: a try
// that has had no reply for 5ms dials the server itself, on a *redis.Client,
// rather than wait for go-redis's dial retries); and a server reached but
// silent until the Timeout returns an error wrapping ErrNoReply (and
// tenace.ErrNoReply) that names key and the Timeout (`redislock: acquiring
// "k": no reply from Redis within the 700ms Timeout (context deadline
// exceeded)`). A Lock reports both as a provider failure (lock.failed), not
// as contention (lock.rejected). How a try in flight at the Timeout is
// judged: it has 20ms more (noreply.LateReply) for its reply, which then
// decides (a grant is returned; "held" is (nil, nil)); without one, a first
// try is ErrNoReply (asked once more, for 10ms, if this process itself was
// starved of CPU for 25ms past that deadline: a socket read past its deadline
// fails even with the reply in the buffer), and a retry — the server has
// already answered "held" — is part of the wait, (nil, nil), unless it had
// gone unanswered for 200ms (the server stalled during the wait: ErrNoReply).
// So on a stalled server Acquire returns within Timeout + 20ms and this
// process's scheduling latency.
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
	a := p.newAttempt(key, ttl)
	a.owner = p.ownerOf(opts.Owner)
	noWait := opts.Timeout == tenace.NoWait
	a.shared, a.permits = opts.Shared, opts.Permits
	if !a.shared && !noWait {
		a.markMS = p.markArg.(int64)
	}
	w, done := p.waitContexts(ctx, opts)
	defer done()
	ls, err := p.drive(w, a, noWait)
	if ls == nil {
		if a.marked {
			p.unmark(a)
		}
		if err == nil && opts.OnHeld != nil {
			a.onHeld(opts.OnHeld)
		}
		return nil, err
	}
	return ls[0], nil
}

// SupportsShared reports true: Acquire honours LockAcquireOptions.Shared
// and Permits (tenace.SharedLockProvider): read/write locks and N permits
// per key, across every process on the server (see the package doc,
// Shared locks). AcquireSet takes its keys exclusive only.
func (p *Provider) SupportsShared() bool { return true }

// waitCtx is one Acquire's contexts: caller is the caller's ctx; acq ends
// with it or at the Timeout, on the options' Clock (tenace.AcquireContext);
// call is what the subscription gets: acq itself on the system clock, whose
// deadline go-redis turns into socket deadlines; with another clock, a
// context with the caller's (real) deadline that ends when acq does. try is
// what each try of the acquire script gets: like call, but it ends
// noreply.LateReply after the Timeout (with the caller's ctx, at once), so
// that a try in flight at the Timeout can still bring its reply. timeout is
// the call's Timeout, for the error that says no answer came within it.
// timeoutAt is the Timeout's deadline on the system clock when it comes
// before ctx's (zero otherwise: no Timeout, another clock, or ctx's
// deadline first): acq ends at it when the timer that cancels acq has run,
// which on a loaded machine can be hundreds of milliseconds later (ended,
// timedOut).
type waitCtx struct {
	caller, acq, call, try context.Context
	timeout                time.Duration
	timeoutAt              time.Time
}

// ended reports whether the acquire has ended: acq has, or the Timeout's
// deadline (timeoutAt) has passed, whether or not acq's timer has run.
func (w waitCtx) ended() bool {
	return w.acq.Err() != nil || w.pastTimeout()
}

// timedOut is tenace.TimedOut(caller, acq), with the Timeout counted as
// ended once its deadline has passed (see ended).
func (w waitCtx) timedOut() bool {
	return tenace.TimedOut(w.caller, w.acq) || w.caller.Err() == nil && w.pastTimeout()
}

// pastTimeout reports whether the Timeout's deadline, on the system clock,
// has passed.
func (w waitCtx) pastTimeout() bool {
	return !w.timeoutAt.IsZero() && !time.Now().Before(w.timeoutAt)
}

// retrySilence is how long a retry (a try after the server answered
// "held" in the same Acquire) may have gone unanswered when the Timeout,
// and noreply.LateReply after it, cut it short, and still count as part of the
// wait, (nil, nil): the server did answer within the Timeout that the key
// is held, which is what (nil, nil) says. A retry left unanswered longer
// means the server stalled during the wait: an error wrapping ErrNoReply.
// Waiters retry often (after their subscription is confirmed, on each
// release message, on the fallback timer), and on a loaded machine (2
// cores at load 16-29, two CPU burners, -race) retries in flight at the
// Timeout went unread for more than noreply.LateReply, and at 100ms still for
// several acquires in a hundred of a held key: each would have been
// reported as an outage. A first try has no such allowance: the server has
// not answered at all.
const retrySilence = 200 * time.Millisecond

// starved reports whether a first try that failed with err was cut short by
// its own deadline (noreply.LateReply after the Timeout, on the system clock)
// more than noreply.StarvedBy before this process saw it fail.
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
	return time.Since(d) > noreply.StarvedBy
}

// probeAfter is how long a try may go without a reply before Acquire dials
// the server itself (see Provider.probe): a dial that fails (connection
// refused, no route) ends the try at once with that error, instead of after
// go-redis's own dial retries (about 2s with its defaults).
const probeAfter = 5 * time.Millisecond

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
func (a *attempt) try(ctx context.Context) (reply, error) {
	var r reply
	err := a.p.probed(ctx, func(ctx context.Context) error {
		var err error
		r, err = a.tryOn(ctx)
		return err
	})
	if err != nil {
		return reply{}, err
	}
	return r, nil
}

// tryOn runs the acquire script once with ctx, and reads its reply.
func (a *attempt) tryOn(ctx context.Context) (reply, error) {
	start := time.Now() // before the send: the local expiry is never after Redis's
	res, err := a.run(ctx)
	if err != nil {
		return reply{}, err
	}
	a.marked = a.marked || res[2] == 2
	switch res[0] {
	case 1:
		return reply{leases: []*lease{a.p.newLease(a, uint64(res[1]), start)}}, nil
	case 0:
		return reply{holderTTL: time.Duration(res[1]) * time.Millisecond, writerWaits: res[2] == 1}, nil
	default: // voided: only after Acquire returned, so never seen by a live one
		return reply{}, errors.New("the acquire was voided")
	}
}

// The claim of one key: see claim.
func (a *attempt) queueVoid()         { a.p.voids.add(a) }
func (a *attempt) describe() string   { return keyfmt.Quote(a.key) }
func (a *attempt) channels() []string { return a.names[6:7] }
func (a *attempt) exclusive() bool    { return !a.shared }

// run runs the acquire script once and returns the integers its reply
// begins with (the third 0 when the reply has two): an exclusive caller's
// first try runs acquireFirstScript, and acquireScript at once after it
// if that answers {-2, 0}; every other try runs acquireScript.
// Each call is made once: a waiter's later tries allocate none.
func (a *attempt) run(ctx context.Context) ([3]int64, error) {
	switch {
	case a.argv == nil && !a.shared:
		a.argv = acquireFirstScript.call(3, 3)
		for _, k := range a.keys[:3] {
			a.argv = append(a.argv, k)
		}
		a.tokenArg = a.token
		a.argv = append(a.argv, a.tokenArg, a.pxArg(), a.owner)
		a.first = true
		out, err := a.send(ctx, acquireFirstScript)
		if err != nil || out[0] != -2 {
			return out, err
		}
		a.fullCall()
	case a.argv == nil || a.first:
		a.fullCall()
	case a.markMS > 0:
		a.argv[len(a.argv)-1] = argShared // "1": an earlier try may have marked
	}
	return a.send(ctx, acquireScript)
}

// fullCall makes a's acquireScript call (see script.call), reusing the
// boxed names and arguments of its acquireFirstScript call if it made one.
func (a *attempt) fullCall() {
	argv := acquireScript.call(len(a.keys), 8)
	keys := a.keys
	px := a.pxArg()
	if a.first {
		argv = append(argv, a.argv[3:6]...)
		keys = keys[3:]
		px = a.argv[7]
	}
	for _, k := range keys {
		argv = append(argv, k)
	}
	if a.tokenArg == nil {
		a.tokenArg = a.token
	}
	shared, mark := argExclusive, argNone
	if a.shared {
		shared = argShared
	}
	if a.markMS > 0 {
		mark = a.p.markArg
	}
	a.argv = append(argv, a.tokenArg, px, a.owner, shared, a.permits, mark, a.p.voidArg, argExclusive)
	a.first = false
}

// pxArg is a's first expiry in ms as an argument: the provider's, boxed
// once, unless a's TTL is shorter.
func (a *attempt) pxArg() any {
	if a.pxMS != a.p.window.Milliseconds() {
		return a.pxMS
	}
	return a.p.windowArg
}

// send runs s with a's call once, and reads its reply (see run): an
// integer is a grant's fencing token (acquireFirstScript's grant).
func (a *attempt) send(ctx context.Context, s *script) ([3]int64, error) {
	var out [3]int64
	reply, err := s.run(ctx, a.p.client, a.argv).Result()
	if err != nil {
		return out, err
	}
	if fence, ok := reply.(int64); ok {
		return [3]int64{1, fence}, nil
	}
	res, ok := reply.([]any)
	if !ok || len(res) < 2 {
		return out, fmt.Errorf("unexpected script reply %v", reply)
	}
	for i, v := range res[:min(len(res), 3)] {
		n, ok := v.(int64)
		if !ok {
			return out, fmt.Errorf("unexpected script reply %v", res)
		}
		out[i] = n
	}
	a.heldBy = nil
	if len(res) > 3 {
		a.heldBy = res[3]
		a.heldTTL = out[1]
	}
	return out, nil
}

// The acquire script's mode argument (and its "may have marked" flag), and
// a mark life of none, boxed once.
var argExclusive, argShared, argNone any = "0", "1", int64(0)

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
