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
// Concurrency: mu guards every field below it. A receive goroutine runs
// while at least one waiter is registered; it exits, closing its
// connection, when the last one leaves (so an idle Provider holds no
// goroutine and no connection).
//
// Order: a channel's SUBSCRIBE and UNSUBSCRIBE must reach the server in the
// order its waiter count changed. The obvious way — change the count under
// mu, send after unlocking — lets a leaving waiter's UNSUBSCRIBE overtake
// the SUBSCRIBE of a waiter that arrived just after it: the server then has
// no subscription while a waiter waits, and that waiter hears no release
// until its fallback retry. So send is held from the count change through
// the send (send before mu; the receive goroutine takes only mu, so it
// never waits for a send). And since a SUBSCRIBE's reply can arrive after
// the channel was unsubscribed and subscribed again, replies are counted
// per channel (pending): only the reply to the last SUBSCRIBE sent
// confirms the current subscription.
type subscriber struct {
	client redis.UniversalClient
	send   sync.Mutex // held while a waiter registers or leaves, sends included

	mu       sync.Mutex
	ps       *redis.PubSub            // nil while nobody waits
	channels map[string]*subscription // by channel
	pending  map[string]int           // SUBSCRIBE replies still to come, by channel
	waiters  int
	stopped  chan struct{} // closed when the current receive goroutine exits

	// Published for Stats (written under mu, read without it).
	nWaiting atomic.Int64 // = waiters
	nLongest atomic.Int64 // the most waiters of one channel
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

// wake wakes the oldest waiter that has no wake-up pending.
func (sub *subscription) wake() {
	for _, w := range sub.waiters {
		select {
		case w.wake <- struct{}{}:
			return
		default: // already has one: it will try; wake the next
		}
	}
}

// wait is one waiter's registration: wake gets a token when the waiter
// should try again — a release message reached it, a waiter ahead of it
// left, or the connection broke (a message may have been lost).
type wait struct {
	channel string
	sub     *subscription
	wake    chan struct{} // buffer 1: wake-ups coalesce
}

func newSubscriber(c redis.UniversalClient) *subscriber {
	return &subscriber{client: c, channels: map[string]*subscription{}, pending: map[string]int{}}
}

// subscribe registers a waiter on channel and sends the SUBSCRIBE if the
// channel has none yet. A release published after w.sub.confirmed is closed
// is heard; until then the caller must keep trying (see Acquire).
func (s *subscriber) subscribe(ctx context.Context, channel string) (*wait, error) {
	s.send.Lock()
	defer s.send.Unlock()
	s.mu.Lock()
	if s.ps == nil {
		// A new connection: no reply of the old one will come.
		clear(s.pending)
		s.ps = s.client.Subscribe(context.WithoutCancel(ctx)) // connects on first SUBSCRIBE
		s.stopped = make(chan struct{})
		go s.receive(s.ps, s.stopped)
	}
	sub := s.channels[channel]
	first := sub == nil
	if first {
		sub = &subscription{confirmed: make(chan struct{})}
		s.channels[channel] = sub
		s.pending[channel]++
	}
	w := &wait{channel: channel, sub: sub, wake: make(chan struct{}, 1)}
	sub.waiters = append(sub.waiters, w)
	s.waiters++
	s.nWaiting.Store(int64(s.waiters))
	if n := int64(len(sub.waiters)); n > s.nLongest.Load() {
		s.nLongest.Store(n)
	}
	ps := s.ps
	s.mu.Unlock()

	if first {
		// Without ctx's deadline: go-redis closes and redials a Pub/Sub
		// connection whose write timed out, so one waiter's short deadline
		// would break the connection every waiter shares (and lose the
		// messages in flight). The write itself is a few bytes into a
		// socket buffer; only a (re)connect waits on the server.
		if err := ps.Subscribe(context.WithoutCancel(ctx), channel); err != nil {
			s.mu.Lock()
			if s.pending[channel]--; s.pending[channel] <= 0 { // most likely never sent: expect no reply
				delete(s.pending, channel)
			}
			s.mu.Unlock()
			s.remove(w, false)
			return nil, err
		}
	}
	return w, nil
}

// unsubscribe removes w; the last waiter of a channel unsubscribes it, and
// the last waiter of all closes the connection and stops the goroutine. A
// waiter that leaves without the lock (acquired false) hands a wake-up on.
func (s *subscriber) unsubscribe(w *wait, acquired bool) {
	s.send.Lock()
	defer s.send.Unlock()
	s.remove(w, acquired)
}

// remove is unsubscribe with send held.
func (s *subscriber) remove(w *wait, acquired bool) {
	s.mu.Lock()
	sub := s.channels[w.channel]
	if sub == nil || sub != w.sub {
		s.mu.Unlock()
		return
	}
	i := slices.Index(sub.waiters, w)
	if i < 0 {
		s.mu.Unlock()
		return
	}
	sub.waiters = slices.Delete(sub.waiters, i, i+1)
	if !acquired {
		sub.wake()
	}
	s.waiters--
	s.nWaiting.Store(int64(s.waiters))
	if int64(len(sub.waiters)+1) == s.nLongest.Load() { // it may have been the longest
		longest := 0
		for _, other := range s.channels {
			longest = max(longest, len(other.waiters))
		}
		s.nLongest.Store(int64(longest))
	}
	ps := s.ps
	var stopped chan struct{}
	lastOfChannel := len(sub.waiters) == 0
	if lastOfChannel {
		delete(s.channels, w.channel)
	}
	if s.waiters == 0 {
		s.ps, stopped = nil, s.stopped
	}
	s.mu.Unlock()
	switch {
	case stopped != nil:
		_ = ps.Close() // ends Receive in the goroutine
		<-stopped
	case lastOfChannel:
		_ = ps.Unsubscribe(context.Background(), w.channel) // best effort: a stray message only wakes nobody
	}
}

// receive reads the connection until it is closed: confirmations release
// the subscribers' waits, release messages wake the channel's waiters, and
// an error (the connection broke; go-redis reconnects and resubscribes on
// the next Receive) wakes every waiter to try again at once.
func (s *subscriber) receive(ps *redis.PubSub, stopped chan struct{}) {
	defer close(stopped)
	backoff := time.NewTimer(0)
	<-backoff.C
	defer backoff.Stop()
	for {
		msg, err := ps.Receive(context.Background())
		s.mu.Lock()
		closed := s.ps != ps
		if closed {
			s.mu.Unlock()
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				n := s.pending[m.Channel] - 1 // below 0 after a reset: a resubscription's reply
				if n > 0 {
					s.pending[m.Channel] = n
				} else {
					delete(s.pending, m.Channel)
				}
				if sub := s.channels[m.Channel]; sub != nil && n <= 0 && !sub.isConf {
					sub.isConf = true
					close(sub.confirmed)
				}
			}
		case *redis.Message:
			if sub := s.channels[m.Channel]; sub != nil {
				sub.wake() // one release, one lock: one waiter tries
			}
		}
		if err != nil {
			// go-redis resubscribes every channel on the new connection;
			// the replies to come are those.
			clear(s.pending)
			for _, sub := range s.channels {
				for _, w := range sub.waiters {
					notify(w) // a message may be lost: everyone tries
				}
			}
		}
		s.mu.Unlock()
		if err != nil {
			// Do not spin on a server that is down: the waiters retry (and
			// fail) on their own; this loop waits a little before
			// reconnecting, or stops when closed.
			backoff.Reset(50 * time.Millisecond)
			<-backoff.C
		}
	}
}

func notify(w *wait) {
	select {
	case w.wake <- struct{}{}:
	default: // already pending
	}
}
