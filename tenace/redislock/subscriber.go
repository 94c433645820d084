package redislock

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// subscriber shares one Redis Pub/Sub connection among every waiter of a
// Provider, so that waiting for a lock costs a SUBSCRIBE on a connection
// that is already open, not a new connection per wait.
//
// Concurrency: mu guards every field below it, and each connection's ops
// and pending. A connection (pubsubConn) is opened by the first waiter and
// has two goroutines: one receives, one sends its SUBSCRIBEs, UNSUBSCRIBEs
// and finally its close, from a queue (ops). The last waiter to leave
// queues the close and forgets the connection, whose goroutines then end
// on their own (so an idle Provider holds no connection, and its goroutines
// only until the close is through); the next waiter opens another. close
// (at Provider.Close) closes the current one and waits for the goroutines
// of all of them.
//
// No waiter waits on the network to leave: a go-redis PubSub holds its
// mutex while it re-opens a broken connection (dial and handshake), and a
// leaving waiter that called Unsubscribe or Close itself would wait for
// that, on a stalled server for the client's read timeout. A leaving
// waiter only queues; a subscribing one waits for its SUBSCRIBE's write,
// and for no longer than its ctx.
//
// Order: a channel's SUBSCRIBE and UNSUBSCRIBE must reach the server in the
// order its waiter count changed. The obvious way — change the count under
// mu, send after unlocking — lets a leaving waiter's UNSUBSCRIBE overtake
// the SUBSCRIBE of a waiter that arrived just after it: the server then has
// no subscription while a waiter waits, and that waiter hears no release
// until its fallback retry. So each count change queues its command under
// mu, in the same critical section, and the one sender sends the queue in
// order (the receive goroutine takes only mu, so it never waits for a
// send). And since a SUBSCRIBE's reply can arrive after the channel was
// unsubscribed and subscribed again, replies are counted per channel
// (pending): only the reply to the last SUBSCRIBE queued confirms the
// current subscription.
type subscriber struct {
	client redis.UniversalClient
	conns  sync.WaitGroup // the goroutines of every connection, current and closing

	mu       sync.Mutex
	conn     *pubsubConn              // nil while nobody waits, and once closed
	channels map[string]*subscription // by channel
	waiters  int
	shared   int  // waiters for a shared lease (wait.exclusive false)
	closed   bool // by close: no connection is opened again

	// onBackoff, if set (by tests, before the first connection), is called
	// by a receive loop with each pause it takes before reading again.
	onBackoff func(time.Duration)

	// Published for Stats (written under mu, read without it).
	nWaiting atomic.Int64 // = waiters
	nShared  atomic.Int64 // = shared
	nLongest atomic.Int64 // the most waiters of one channel
}

// pubsubConn is one Pub/Sub connection and its queue of commands to send.
// ops and pending are guarded by subscriber.mu.
type pubsubConn struct {
	ps      *redis.PubSub
	ops     []op           // to send, in order; a close is the last
	ready   chan struct{}  // buffer 1: ops is not empty
	pending map[string]int // SUBSCRIBE replies still to come, by channel
	gone    chan struct{}  // closed, with the close queued, when it stops being the current connection
}

// op is a command for a connection's sender.
type op struct {
	kind    opKind
	channel string
	sent    chan error // opSubscribe: buffer 1, the write's outcome
}

type opKind int

const (
	opSubscribe opKind = iota
	opUnsubscribe
	opClose
)

// queue adds o to the connection's queue; mu held.
func (c *pubsubConn) queue(o op) {
	c.ops = append(c.ops, o)
	select {
	case c.ready <- struct{}{}:
	default: // the sender has been told already
	}
}

// retire queues the connection's close, once it is no longer the current
// one, and ends its receive loop's pause; mu held.
func (c *pubsubConn) retire() {
	c.queue(op{kind: opClose}) // ends a Receive in progress
	close(c.gone)
}

// subscription is one channel's waiters, oldest first.
//
// Fairness: a release message wakes one waiter, the oldest, rather than all
// of them — only one can win the lock, and waking every waiter would send a
// herd of scripts that all but one lose. A waiter that leaves without the
// lock (timeout, ctx, error) passes a wake-up to the next oldest, in case it
// was the one woken; a spare wake-up costs one extra try. So within one
// process waiters retry roughly in arrival order; across processes, whoever's
// script runs first wins.
type subscription struct {
	confirmed chan struct{} // closed when Redis confirmed the SUBSCRIBE
	isConf    bool
	waiters   []*wait // arrival order
}

// wake wakes the oldest waiter that has no wake-up pending (a waiter with
// one pending will try anyway): among the waiters younger than after if
// after is not nil, and among the exclusive ones if writers; mu held. It
// is the one way a wake-up moves: a release message, a waiter that leaves
// without the lock, and a waiter that could not use its wake-up (passOn).
func (sub *subscription) wake(after *wait, writers bool) {
	from := 0
	if after != nil {
		if from = slices.Index(sub.waiters, after) + 1; from == 0 {
			return
		}
	}
	for _, w := range sub.waiters[from:] {
		if writers && !w.exclusive {
			continue
		}
		select {
		case w.wake <- struct{}{}:
			return
		default: // already has one: it will try; wake the next
		}
	}
}

// passOn gives the wake-up w was woken with, and could not use, to
// another waiter of its channel: with writers, to the oldest writer (a
// shared waiter refused because a writer waits: the shared ones behind
// would be refused as well); otherwise to a waiter younger than w (a set
// whose key was freed but that could not take the set: only younger, so
// that two sets waiting on the same keys never hand a wake-up back and
// forth).
func (s *subscriber) passOn(w *wait, writers bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.channels[w.channel] != w.sub {
		return
	}
	if writers {
		w.sub.wake(nil, true)
	} else {
		w.sub.wake(w, false)
	}
}

// wait is one waiter's registration: wake gets a token when the waiter
// should try again — a release message reached it, a waiter ahead of it
// left, or the connection broke or came back (a message may have been
// lost).
type wait struct {
	channel string
	sub     *subscription
	wake    chan struct{} // buffer 1: wake-ups coalesce
	// exclusive: an exclusive caller's wait, which a shared waiter refused
	// because a writer waits wakes (passOn).
	exclusive bool
}

func newSubscriber(c redis.UniversalClient) *subscriber {
	return &subscriber{client: c, channels: map[string]*subscription{}}
}

// subscribe registers a waiter on channel and, if the channel has none yet,
// queues its SUBSCRIBE and waits for it to be written, or for ctx to end.
// A release published after w.sub.confirmed is closed is heard; until then
// the caller must keep trying (see Acquire).
func (s *subscriber) subscribe(ctx context.Context, channel string, exclusive bool) (*wait, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	c := s.conn
	if c == nil {
		// A new connection, with nothing pending: no reply of an old one
		// reaches it.
		c = &pubsubConn{
			ps:      s.client.Subscribe(context.WithoutCancel(ctx)), // connects on first use
			ready:   make(chan struct{}, 1),
			pending: map[string]int{},
			gone:    make(chan struct{}),
		}
		s.conn = c
		s.conns.Add(2)
		go s.send(c)
		go s.receive(c)
	}
	sub := s.channels[channel]
	first := sub == nil
	var sent chan error
	if first {
		sub = &subscription{confirmed: make(chan struct{})}
		s.channels[channel] = sub
		c.pending[channel]++
		sent = make(chan error, 1)
		c.queue(op{kind: opSubscribe, channel: channel, sent: sent})
	}
	w := &wait{channel: channel, sub: sub, wake: make(chan struct{}, 1), exclusive: exclusive}
	sub.waiters = append(sub.waiters, w)
	s.waiters++
	s.nWaiting.Store(int64(s.waiters))
	if !exclusive {
		s.shared++
		s.nShared.Store(int64(s.shared))
	}
	if n := int64(len(sub.waiters)); n > s.nLongest.Load() {
		s.nLongest.Store(n)
	}
	s.mu.Unlock()

	if first {
		// The write is quick on an open connection; on one being opened, or
		// re-opened after it broke, it waits for the server, and the
		// waiter waits no longer than ctx. (The write itself has no
		// deadline: see send.)
		var err error
		select {
		case err = <-sent:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err != nil {
			s.unsubscribe(w, false)
			return nil, err
		}
	}
	return w, nil
}

// unsubscribe removes w; the last waiter of a channel queues its
// UNSUBSCRIBE, and the last waiter of all queues the connection's close,
// and none waits for them. A waiter that leaves without the lock
// (acquired false) hands a wake-up on.
func (s *subscriber) unsubscribe(w *wait, acquired bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub := s.channels[w.channel]
	if sub == nil || sub != w.sub {
		return
	}
	i := slices.Index(sub.waiters, w)
	if i < 0 {
		return
	}
	sub.waiters = slices.Delete(sub.waiters, i, i+1)
	if !acquired {
		sub.wake(nil, false)
	}
	s.waiters--
	s.nWaiting.Store(int64(s.waiters))
	if !w.exclusive {
		s.shared--
		s.nShared.Store(int64(s.shared))
	}
	if int64(len(sub.waiters)+1) == s.nLongest.Load() { // it may have been the longest
		longest := 0
		for _, other := range s.channels {
			longest = max(longest, len(other.waiters))
		}
		s.nLongest.Store(int64(longest))
	}
	lastOfChannel := len(sub.waiters) == 0
	if lastOfChannel {
		delete(s.channels, w.channel)
	}
	c := s.conn
	switch {
	case c == nil: // closed: nothing to send
	case s.waiters == 0:
		s.conn = nil
		c.retire()
	case lastOfChannel:
		c.queue(op{kind: opUnsubscribe, channel: w.channel}) // best effort: a stray message only wakes nobody
	}
}

// close closes the current connection, refuses new ones, and waits for the
// goroutines of every connection to end: at once (a receive loop's pause
// between reconnects ends with it), unless go-redis is opening or
// re-opening one, which holds its commands (the close included) for up to
// the client's dial and read timeouts on a stalled server.
// Waiters still registered stay so until they leave (Acquire's callers
// return at Provider.Close); nothing is sent for them.
func (s *subscriber) close() {
	s.mu.Lock()
	s.closed = true
	if c := s.conn; c != nil {
		s.conn = nil
		c.retire()
	}
	s.mu.Unlock()
	s.conns.Wait()
}

// send sends c's queued commands, in order, until its close. A SUBSCRIBE
// is sent without its waiter's deadline: go-redis closes and redials a
// Pub/Sub connection whose write timed out, so one waiter's short deadline
// would break the connection every waiter shares (and lose the messages in
// flight). The write itself is a few bytes into a socket buffer; only a
// (re)connect waits on the server, which go-redis bounds by the client's
// dial and read timeouts.
func (s *subscriber) send(c *pubsubConn) {
	defer s.conns.Done()
	for {
		s.mu.Lock()
		for len(c.ops) == 0 {
			s.mu.Unlock()
			<-c.ready
			s.mu.Lock()
		}
		o := c.ops[0]
		c.ops[0] = op{}
		c.ops = c.ops[1:]
		s.mu.Unlock()
		switch o.kind {
		case opSubscribe:
			err := c.ps.Subscribe(context.Background(), o.channel)
			if err != nil {
				s.mu.Lock()
				if c.pending[o.channel]--; c.pending[o.channel] <= 0 { // most likely never sent: expect no reply
					delete(c.pending, o.channel)
				}
				s.mu.Unlock()
			}
			o.sent <- err
		case opUnsubscribe:
			_ = c.ps.Unsubscribe(context.Background(), o.channel)
		case opClose:
			_ = c.ps.Close()
			return
		}
	}
}

// receive reads c until it is closed: confirmations release the
// subscribers' waits, release messages wake the channel's waiters, and an
// error (the connection broke; go-redis re-opens it and resubscribes
// within that Receive, or, if that failed, in the next) wakes every waiter
// to try again at once. After a failed read it reads again at once or
// pauses (see reconnectPause). Once c is no longer the current connection,
// it reads nothing more for the waiters and returns (the close queued by
// the last waiter ends a Receive in progress, and retire a pause).
func (s *subscriber) receive(c *pubsubConn) {
	defer s.conns.Done()
	var pause *time.Timer // made at the first pause
	defer func() {
		if pause != nil {
			pause.Stop()
		}
	}()
	failed := 0 // reads failed in a row
	for {
		msg, err := c.ps.Receive(context.Background())
		s.mu.Lock()
		if s.conn != c {
			s.mu.Unlock()
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				n := c.pending[m.Channel] - 1 // below 0 after a reset: a resubscription's reply
				if n > 0 {
					c.pending[m.Channel] = n
				} else {
					delete(c.pending, m.Channel)
				}
				if sub := s.channels[m.Channel]; sub != nil && n <= 0 && !sub.isConf {
					sub.isConf = true
					close(sub.confirmed)
				}
			}
		case *redis.Message:
			if sub := s.channels[m.Channel]; sub != nil {
				sub.wake(nil, false) // one release, one lock: one waiter tries
			}
		}
		if err != nil {
			// go-redis resubscribes every channel on the new connection;
			// the replies to come are those.
			clear(c.pending)
		}
		// A message may have been lost: everyone tries, when the
		// connection breaks, and again when a read succeeds after failed
		// ones — the resubscription's reply, so from here on releases are
		// heard. Without the second, a release published while the
		// re-open was failing, after the waiters had tried, would reach
		// them only at their fallback retry.
		if err != nil || failed > 0 {
			for _, sub := range s.channels {
				for _, w := range sub.waiters {
					notify(w)
				}
			}
		}
		s.mu.Unlock()
		if err == nil {
			failed = 0
			continue
		}
		failed++
		d := reconnectPause(failed)
		if d == 0 {
			continue
		}
		if s.onBackoff != nil {
			s.onBackoff(d)
		}
		if pause == nil {
			pause = time.NewTimer(d)
		} else {
			pause.Reset(d) // it fired and was drained: no stale tick
		}
		select {
		case <-pause.C:
		case <-c.gone:
			return // closed meanwhile: nothing more to read for the waiters
		}
	}
}

// The receive loop's pace after a failed read. go-redis re-opens a broken
// Pub/Sub connection, and resubscribes its channels, inside the read that
// found it broken, so the next read goes at once: a pause there would hold
// back the release messages already arriving on the new connection (it
// did, 50ms, before). A failure after that one means the re-open failed
// (the server is down, or refuses): the loop pauses, reconnectPauseMin
// first, doubling up to reconnectPauseMax, so that a server that stays
// unreachable costs at most a few dials a second; a read that succeeds
// starts over. The waiters do not depend on this pace: each failure wakes
// them to try, and they retry on their fallback interval anyway.
const (
	reconnectPauseMin = 50 * time.Millisecond
	reconnectPauseMax = time.Second
)

// reconnectPause is the receive loop's pause after the failed-th read in
// a row that failed: none after the first.
func reconnectPause(failed int) time.Duration {
	if failed < 2 {
		return 0
	}
	return min(reconnectPauseMin<<min(failed-2, 5), reconnectPauseMax)
}

func notify(w *wait) {
	select {
	case w.wake <- struct{}{}:
	default: // already pending
	}
}
