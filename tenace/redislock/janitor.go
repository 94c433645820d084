package redislock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// voidScript: KEYS[1] the lock, KEYS[2] the token's void marker; ARGV[1]
// the token, ARGV[2] the release channel, ARGV[3] the marker's life in ms
// (see minVoidLife).
//
// It marks the token void for that long — so that an acquire script of
// that token that reaches the server later (still queued in a socket, or a
// go-redis retry) takes nothing — and deletes the lock if the token holds
// it, waking its waiters. Marker first, then delete: the order does not
// matter within a script, and either order of the two scripts on the server
// leaves the key free.
var voidScript = newScript("void", holdsLua+`
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
if holds(redis.call('GET', KEYS[1]), ARGV[1]) then
	redis.call('DEL', KEYS[1])
	redis.call('PUBLISH', ARGV[2], '1')
	return 1
end
return 0
`)

// sharedVoidScript: KEYS[1] the lock, KEYS[2] the token's void marker,
// KEYS[3] the shared holders; ARGV as voidScript's. voidScript for a
// shared caller: it marks the token void and removes its member if it is
// one of the holders (see sharedReleaseScript).
var sharedVoidScript = newScript("sharedVoid", `
redis.replicate_commands()
`+sharedLua+`
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
if redis.call('ZREM', KEYS[3], ARGV[1]) == 1 then
	settle(KEYS[1], KEYS[3], now())
	redis.call('PUBLISH', ARGV[2], '1')
	return 1
end
return 0
`)

// void runs a's void script once.
func (a *attempt) void(ctx context.Context) error {
	if a.shared {
		return sharedVoidScript.Run(ctx, a.p.client, []string{a.lockKey, a.voidKey(), a.holdersKey()}, a.token, a.channel(), a.p.voidArg).Err()
	}
	return voidScript.Run(ctx, a.p.client, []string{a.lockKey, a.voidKey()}, a.token, a.channel(), a.p.voidArg).Err()
}

// minVoidLife is the shortest life of a token's void marker (set by a
// void, and by a release): a marker lives one window, and at least this
// long, and at least as long as the client's options let go-redis send
// copies of a call (retrySpan). A copy of a script that reaches the server after its marker is
// gone is not stopped by it: an acquire copy takes the key for its first
// expiry (as a holder that died would hold it), and a retried release
// finds no trace of its first run and reports a loss. Such copies come
// from go-redis's retries — each sent only after the previous send's read
// timed out (3s by default), so 3 retries and their backoffs (up to 512ms)
// end about 10.5s after the first send — or from a network that holds a
// packet that long. So not the first expiry, min(window, TTL), which a
// short TTL makes far shorter than go-redis waits before it retries. The
// cost: one key, about 190 bytes of server memory, per release and per
// void, for that long.
const minVoidLife = 15 * time.Second

// The janitor's pace: one void at a time. After a failure it goes on to
// the next entry at once (its key may be on another node of a Cluster or a
// Ring, or the server answered with an error about this key alone), and
// waits only once every entry pending has failed since the last wait or
// success: voidBackoffMin, doubling to voidBackoffMax, so that a key
// orphaned by a stall is freed within about voidBackoffMax of the server
// answering again, once the voids ahead of it have run (a void already in
// flight when it answers is quicker still).
const (
	voidCallTimeout = time.Second
	voidBackoffMin  = 5 * time.Millisecond
	voidBackoffMax  = 50 * time.Millisecond // well under the 100ms after a stall by which the keys it left are to be free (the outage bound, see ErrNoReply)
)

// janitor undoes acquires whose outcome is unknown: a script sent, then an
// error or a deadline before its reply. The script may have run, or may
// run later (queued on a stalled server, or retried by go-redis), and take
// the key for its first expiry with nobody holding the lease. For each
// such attempt the janitor runs voidScript until it succeeds, the entry
// expires (see voidEntry), or the provider is closed.
//
// Fairness: the pending entries are a queue; a void that fails sends its
// entry to the back, so an entry that keeps failing (a WRONGTYPE on its
// key, say) never holds up the others, which are tried at once after it.
//
// Concurrency: mu guards pending, running and closed. One goroutine runs
// while pending is not empty (started by add, it exits when pending is
// empty), so an idle provider has none; close stops it and waits for it.
// A voidEntry's fields are the goroutine's alone once it is queued.
type janitor struct {
	p    *Provider
	stop context.Context // ends at close: cuts the call in flight short
	halt context.CancelFunc
	wg   sync.WaitGroup

	mu      sync.Mutex
	pending []*voidEntry // the next to try first
	running bool
	closed  bool
}

// voidEntry is one attempt to undo, and how long it is worth trying.
//
// Why an entry may be dropped, and when. The attempt's key, if one of its
// acquire scripts took it, expires pxMS (its first expiry, min(window,
// TTL)) after that script ran, on the server's clock: no lease was handed
// out, so nothing renews it, and a later run of the same token finds the
// key its own and returns without setting an expiry. So once the
// scripts have all run, retrying the void for more than pxMS frees nothing
// that the server would not free anyway. The janitor cannot see the
// scripts run, but it sees the server answer:
//
//   - An error reply (a redis.Error: WRONGTYPE, NOPERM, OOM, LOADING,
//     READONLY...) says the server is reading commands, so the acquire's
//     copies, sent before the void, have run (a copy that the network holds
//     longer is not stopped by the markers either: see minVoidLife). From
//     the first such reply the entry is tried for pxMS more, then dropped.
//     Not dropped at once, even on a reply that looks final: an error
//     reply does not say the key is free. The acquire may have taken it
//     before the error's cause arose (a failover's READONLY, an OOM, a
//     LOADING after a restart that kept the key), and a Lua script that
//     fails midway keeps its earlier writes, so an error from either script
//     does not prove the other did nothing. Telling the errors that pass
//     (LOADING, BUSY, TRYAGAIN, CLUSTERDOWN, MASTERDOWN, READONLY, OOM)
//     from those that do not would be a list to keep in step with Redis,
//     and a mistake in it would leave a key held by nobody. Retrying for
//     pxMS needs no list: while a key this token may hold lives, a retry
//     that gets through frees it; an error that never passes costs pxMS of
//     retries, about one every voidBackoffMax. (Those cannot leave the key
//     held anyway: WRONGTYPE comes from the void's GET, after its SET of
//     the marker, so the lock key is not a string, let alone this token's;
//     CROSSSLOT and NOPERM refuse the acquire's script before it runs as
//     they refuse this one, barring an ACL changed in between.)
//   - No answer (a network error, a timeout): the scripts may still be
//     queued on a stalled server, which runs them when it resumes, and the
//     void is what frees the key then. The entry is tried until the void
//     marker's life (voidMS, at least pxMS) has passed since the attempt
//     failed: the horizon past which the design gives up on late copies
//     anyway (a copy that reaches the server after its marker is gone is
//     not stopped: see minVoidLife), and which bounds the work of a
//     janitor on a server that is gone for good. Voids sent during a stall
//     and cut short are queued on the server too, and still run when it
//     resumes. A key left by a dropped entry is held by nobody for at most
//     pxMS after its script ran, as a holder that died would hold it.
//
// A dropped entry is logged with the provider's logger, if it has one.
type voidEntry struct {
	a        *attempt
	deadline time.Time // dropped if a void fails at or after this
	answered bool      // the server has replied with an error: deadline is pxMS after the first reply
}

func newJanitor(p *Provider) *janitor {
	j := &janitor{p: p}
	j.stop, j.halt = context.WithCancel(context.Background())
	return j
}

// add queues a to be voided.
func (j *janitor) add(a *attempt) {
	v := &voidEntry{a: a, deadline: time.Now().Add(time.Duration(j.p.voidMS) * time.Millisecond)}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return // left to its TTL: see Provider.Close
	}
	j.pending = append(j.pending, v)
	if !j.running {
		j.running = true
		j.wg.Add(1)
		go j.run()
	}
}

func (j *janitor) run() {
	defer j.wg.Done()
	backoff := voidBackoffMin
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	failed := 0 // voids failed since the last success or wait
	for {
		j.mu.Lock()
		if len(j.pending) == 0 || j.closed {
			j.running = false
			j.mu.Unlock()
			return
		}
		v := j.pending[0]
		j.mu.Unlock()

		a := v.a
		ctx, cancel := context.WithTimeout(j.stop, voidCallTimeout)
		err := a.void(ctx)
		cancel()
		var reply redis.Error
		answered := errors.As(err, &reply)
		now := time.Now()
		if answered && !v.answered {
			v.answered, v.deadline = true, now.Add(time.Duration(a.pxMS)*time.Millisecond)
		}
		expired := !now.Before(v.deadline)

		j.mu.Lock()
		n := len(j.pending)
		dropped := false
		if n > 0 && j.pending[0] == v { // v is still first unless close emptied the queue: add only appends
			j.pending = slices.Delete(j.pending, 0, 1)
			if err != nil && !expired {
				j.pending = append(j.pending, v) // to the back: it holds up no other
			}
			dropped = err != nil && expired
		}
		j.mu.Unlock()

		if err == nil {
			backoff, failed = voidBackoffMin, 0
			continue
		}
		if dropped && j.p.logger != nil {
			j.p.logger.Warn("redislock: gave up undoing an acquire whose outcome is unknown: if its script took the key, nobody holds it until its first expiry after the script ran",
				"key", a.key, "firstExpiry", time.Duration(a.pxMS)*time.Millisecond, "serverAnswered", v.answered, "error", err)
		}
		if failed++; failed < n {
			// The next entry may well succeed: the server answers, or
			// (on a Cluster or a Ring) its key lives on another node.
			continue
		}
		failed = 0
		timer.Reset(backoff)
		select {
		case <-timer.C:
		case <-j.stop.Done():
		}
		backoff = min(2*backoff, voidBackoffMax)
	}
}

// close drops what is pending and waits for the goroutine to exit.
func (j *janitor) close() {
	j.mu.Lock()
	j.closed = true
	j.pending = nil
	j.mu.Unlock()
	j.halt()
	j.wg.Wait()
}
