package redislock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"tenace.dev/tenace"
	"tenace.dev/tenace/clock"
	"tenace.dev/tenace/internal/noreply"
)

var _ tenace.MultiLockProvider = (*Provider)(nil)

// setScript: for each key i of the set (1-based), KEYS[3i-2] its lock,
// KEYS[3i-1] its fencing counter, KEYS[3i] the void marker of its token;
// ARGV[1] the first expiry in ms, ARGV[1+i] key i's token, ARGV[2+n] the
// grant's owner label, recorded in each lock's value (see holdsLua). Every
// name it touches is a declared key (see acquireScript).
//
// acquireScript for several keys, all or none: {1, fence_1, ..., fence_n}
// when every key is this set's (granted now, or by an earlier run of the
// same acquire whose reply was lost: each key's token is found and its
// counter returned); {0, the least PTTL of the keys held, held_1, ...,
// held_n} (held_i 1 when another token holds key i, else 0) when another
// token holds any of them, and then it writes nothing; {-1} when a token of
// the set was voided. Each key gets its token and fencing token exactly as
// a single grant does (fenceLua), so single grants and sets exclude each
// other.
var setScript = newScript("acquireSet", `
redis.replicate_commands()
`+fenceLua+holdsLua+`
local n = #KEYS / 3
local held, minttl, own = {}, nil, {}
for i = 1, n do
	local holder = redis.call('GET', KEYS[3*i-2])
	held[i] = 0
	if holds(holder, ARGV[1+i]) then
		own[i] = true
	elseif holder then
		held[i] = 1
		local ttl = redis.call('PTTL', KEYS[3*i-2])
		if minttl == nil or ttl < minttl then
			minttl = ttl
		end
	elseif redis.call('EXISTS', KEYS[3*i]) == 1 then
		return {-1}
	end
end
if minttl ~= nil then
	local res = {0, minttl}
	for i = 1, n do
		res[2+i] = held[i]
	end
	return res
end
local us, usS, msS = clock()
local res = {1}
for i = 1, n do
	if own[i] then
		res[1+i] = tonumber(redis.call('GET', KEYS[3*i-1]) or '0')
	else
		local fence, f = nextFence(KEYS[3*i-1], us, usS)
		res[1+i] = fence
		local v = ARGV[1+i]
		if ARGV[2+n] then
			v = v .. ' ' .. owned('x', msS, f, ARGV[2+n])
		end
		redis.call('SET', KEYS[3*i-2], v, 'PX', ARGV[1])
	end
end
return res
`)

// AcquireSet acquires every key of keys, all or none, and returns their
// lease (tenace.MultiLockProvider; tenace.AcquireAll calls it): one lease
// of this provider per key, each with the key's own fencing token, renewed
// and lost as a single key's lease is, in sorted key order.
//
// When the keys' names share a hash slot — on a *redis.Client (standalone
// or failover), always; on a Cluster, a Ring or another client, when every
// key has the same hash tag (redislock names key k's lock prefix+"{"+k+"}",
// so keys that start with the same text up to a "}", such as "acct}7" and
// "acct}9", share the tag "acct") — one Lua script takes all the keys or
// none, atomically, with the same token, expiry and fencing counter as a
// single Acquire's: the set never holds some keys while it waits for the
// others, so it cannot deadlock with anyone, sets or single callers,
// whatever order they take keys in. A set that must wait subscribes to the
// release channel of every key, tries again on any key's release, and
// otherwise waits, tries and reports exactly as Acquire does: (nil, nil)
// only when the server answered that a key is held, an outage is an error,
// and a try whose outcome is unknown is voided for every key of the set
// (see Acquire).
//
// Otherwise (keys on different slots of a Cluster, different shards of a
// Ring) it takes the keys one by one in sorted order, as tenace.AcquireAll
// does for any provider: each with Acquire, holding those granted while it
// waits for the next.
//
// The Timeout (opts.Timeout) and ctx bound the whole set.
func (p *Provider) AcquireSet(ctx context.Context, keys []string, opts tenace.LockAcquireOptions) (*tenace.SetLease, error) {
	if ctx == nil {
		panic("tenace: redislock.Provider.AcquireSet: nil context: pass context.Background() or the caller's context")
	}
	if err := tenace.ValidateSet(keys, opts); err != nil {
		return nil, err
	}
	if err := validTTL(opts); err != nil {
		return nil, err
	}
	if !p.oneSlot(keys) {
		// The generic path, on this provider seen as a plain LockProvider
		// (which has no AcquireSet to come back to).
		return tenace.AcquireAll(ctx, struct{ tenace.LockProvider }{p}, keys, opts)
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
	sorted := slices.Sorted(slices.Values(keys))
	s := &setAttempt{p: p, name: strings.Join(sorted, ","), owner: p.ownerOf(opts.Owner)}
	for _, k := range sorted {
		s.parts = append(s.parts, p.newAttempt(k, ttl))
	}
	w, done := p.waitContexts(ctx, opts)
	defer done()
	leases, err := p.drive(w, s, opts.Timeout == tenace.NoWait)
	if leases == nil {
		return nil, err
	}
	ls := make([]tenace.LockLease, len(leases))
	for i, l := range leases {
		ls[i] = l
	}
	return tenace.NewSetLease(sorted, ls), nil
}

// oneSlot reports whether one script can take keys: on a *redis.Client
// every name is on the one server; on any other client, only names with
// the same hash tag are sure to be on one node.
func (p *Provider) oneSlot(keys []string) bool {
	if _, ok := p.client.(*redis.Client); ok {
		return true
	}
	lock, _, _ := p.names(keys[0])
	tag := hashTag(lock)
	for _, k := range keys[1:] {
		if lock, _, _ := p.names(k); hashTag(lock) != tag {
			return false
		}
	}
	return true
}

// hashTag is the part of name that Redis Cluster hashes: the text between
// its first "{" and the first "}" after it, if not empty; else all of it.
func hashTag(name string) string {
	if i := strings.IndexByte(name, '{'); i >= 0 {
		if j := strings.IndexByte(name[i+1:], '}'); j > 0 {
			return name[i+1 : i+1+j]
		}
	}
	return name
}

// waitContexts builds the contexts of one Acquire or AcquireSet (see
// waitCtx). done releases them.
func (p *Provider) waitContexts(ctx context.Context, opts tenace.LockAcquireOptions) (waitCtx, func()) {
	if opts.Timeout <= 0 {
		// No Timeout: the acquire ends with ctx alone, whatever the clock
		// (tenace.AcquireContext's actx would only follow it).
		return waitCtx{caller: ctx, acq: ctx, call: ctx, try: ctx, timeout: opts.Timeout}, func() {}
	}
	actx, cancel := tenace.AcquireContext(ctx, opts)
	w := waitCtx{caller: ctx, acq: actx, call: actx, try: actx, timeout: opts.Timeout}
	if !clock.IsSystem(opts.Clock) {
		// actx's deadline is on opts.Clock, and go-redis would take it for
		// a real one (with a clock behind real time every call would time
		// out at once): the calls get ctx's deadline, and end with actx;
		// a try, noreply.LateReply after the Timeout.
		call, cancelCall := context.WithCancel(ctx)
		try, cancelTry := context.WithCancel(ctx)
		stop := context.AfterFunc(actx, func() {
			cancelCall()
			if tenace.TimedOut(ctx, actx) {
				time.AfterFunc(noreply.LateReply, cancelTry)
			} else {
				cancelTry()
			}
		})
		w.call, w.try = call, try
		return w, func() { stop(); cancelCall(); cancelTry(); cancel() }
	}
	if d, ok := actx.Deadline(); ok && opts.Timeout > 0 {
		try, cancelTry := context.WithDeadline(ctx, d.Add(noreply.LateReply))
		w.try = try
		if cd, ok := ctx.Deadline(); !ok || cd.After(d) {
			w.timeoutAt = d
		}
		return w, func() { cancelTry(); cancel() }
	}
	return w, cancel
}

// setAttempt is one AcquireSet call on one slot: an attempt per key (its
// token, names and void marker), every try of it sending the same tokens.
type setAttempt struct {
	p     *Provider
	name  string     // the keys, sorted, joined by commas: for errors
	parts []*attempt // sorted by key
	owner any        // the grant's owner (see Provider.ownerOf)
}

// try runs the set's script once, dialling the server as attempt.try does
// when no reply has come within probeAfter. It returns one lease per part
// when granted; else the least PTTL of the keys held, and which are held.
func (s *setAttempt) try(ctx context.Context) (reply, error) {
	var r reply
	err := s.p.probed(ctx, func(ctx context.Context) (err error) {
		r, err = s.tryOn(ctx)
		return err
	})
	return r, err
}

// tryOn runs the set's script once with ctx and reads its reply.
func (s *setAttempt) tryOn(ctx context.Context) (reply, error) {
	n := len(s.parts)
	keys := make([]string, 0, 3*n)
	args := make([]any, 1, 2+n)
	args[0] = s.parts[0].pxMS
	for _, a := range s.parts {
		keys = append(keys, a.lockKey, a.fenceKey(), a.voidKey())
		args = append(args, a.token)
	}
	args = append(args, s.owner)
	start := time.Now() // before the send: the local expiry is never after Redis's
	res, err := setScript.Run(ctx, s.p.client, keys, args...).Int64Slice()
	if err != nil {
		return reply{}, err
	}
	switch {
	case len(res) == n+1 && res[0] == 1:
		leases := make([]*lease, n)
		for i, a := range s.parts {
			leases[i] = s.p.newLease(a, uint64(res[1+i]), start)
		}
		return reply{leases: leases}, nil
	case len(res) == n+2 && res[0] == 0:
		held := make([]bool, n)
		for i := range held {
			held[i] = res[2+i] == 1
		}
		return reply{holderTTL: time.Duration(res[1]) * time.Millisecond, held: held}, nil
	case len(res) == 1 && res[0] == -1: // only after AcquireSet returned, so never seen by a live one
		return reply{}, errors.New("the acquire was voided")
	default:
		return reply{}, fmt.Errorf("unexpected script reply %v", res)
	}
}

// The claim of a set: see claim. A try whose outcome is unknown may have
// taken, or may yet take, all the keys: every part is voided.
func (s *setAttempt) queueVoid() {
	for _, a := range s.parts {
		s.p.voids.add(a)
	}
}
func (s *setAttempt) describe() string { return fmt.Sprintf("the set %q", s.name) }
func (s *setAttempt) exclusive() bool  { return true }
func (s *setAttempt) channels() []string {
	chs := make([]string, len(s.parts))
	for i, a := range s.parts {
		chs[i] = a.channel()
	}
	return chs
}
