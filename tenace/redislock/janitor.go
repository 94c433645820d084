package redislock

import (
	"context"
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
var voidScript = redis.NewScript(`
redis.call('SET', KEYS[2], '1', 'PX', ARGV[3])
if redis.call('GET', KEYS[1]) == ARGV[1] then
	redis.call('DEL', KEYS[1])
	redis.call('PUBLISH', ARGV[2], '1')
	return 1
end
return 0
`)

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

// The janitor's pace: one void at a time; after a failure it waits
// voidBackoffMin, doubling to voidBackoffMax, so that a key orphaned by a
// stall is freed within about voidBackoffMax of the server answering again
// (a void already in flight when it answers is quicker still).
const (
	voidCallTimeout = time.Second
	voidBackoffMin  = 5 * time.Millisecond
	voidBackoffMax  = 100 * time.Millisecond
)

// janitor undoes acquires whose outcome is unknown: a script sent, then an
// error or a deadline before its reply. The script may have run, or may
// run later (queued on a stalled server, or retried by go-redis), and take
// the key for its TTL with nobody holding the lease. For each such attempt
// the janitor runs voidScript until the server answers, or the provider is
// closed.
//
// Concurrency: mu guards pending, running and closed. One goroutine runs
// while pending is not empty (started by add, it exits when pending is
// empty), so an idle provider has none; close stops it and waits for it.
type janitor struct {
	p    *Provider
	stop context.Context // ends at close: cuts the call in flight short
	halt context.CancelFunc
	wg   sync.WaitGroup

	mu      sync.Mutex
	pending []*attempt // oldest first
	running bool
	closed  bool
}

func newJanitor(p *Provider) *janitor {
	j := &janitor{p: p}
	j.stop, j.halt = context.WithCancel(context.Background())
	return j
}

// add queues a to be voided.
func (j *janitor) add(a *attempt) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return // left to its TTL: see Provider.Close
	}
	j.pending = append(j.pending, a)
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
	for {
		j.mu.Lock()
		if len(j.pending) == 0 || j.closed {
			j.running = false
			j.mu.Unlock()
			return
		}
		a := j.pending[0]
		j.mu.Unlock()

		ctx, cancel := context.WithTimeout(j.stop, voidCallTimeout)
		err := voidScript.Run(ctx, j.p.client, []string{a.lockKey, a.voidKey}, a.token, a.channel, j.p.voidMS).Err()
		cancel()
		if err == nil {
			j.mu.Lock()
			if len(j.pending) > 0 && j.pending[0] == a { // a is still first unless close emptied the queue: add only appends
				j.pending = slices.Delete(j.pending, 0, 1)
			}
			j.mu.Unlock()
			backoff = voidBackoffMin
			continue
		}
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
