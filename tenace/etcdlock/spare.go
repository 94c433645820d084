package etcdlock

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"tenace.dev/tenace/internal/provkit"
)

// takeSpare returns the spare etcd lease — granted ahead of need, or
// given back by a clean release — and the time its expiry is measured
// from, if it has at least a renewal interval and spareSlack left before
// its loss time (the keeper Acquire starts for it sends its first
// keepalive halfway there, and that has as long to come back);
// nil when there is none fit for use, and then it starts the grant of the
// next spare in the background, unless one is in flight or the provider
// is closed.
//
// A spare takes the lease grant, a Raft write, off the critical path of
// Acquire, which is then one transaction (the queueing) and a release
// one more (the delete), as concurrency.Mutex's two. An etcd lease still
// carries one entry at most, of the grant or the wait that has it (see
// "Leases" in the package doc): a spare has nothing attached until an
// Acquire puts its entry on it, and one that no Acquire takes lapses
// within its TTL, as do a killed process's. A spare etcd no longer has
// when the Acquire queues on it is replaced by a fresh grant (doRegrant).
func (p *Provider) takeSpare() (*clientv3.LeaseGrantResponse, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	g, sent := p.spare, p.spareSent
	p.spare = nil
	fit := g != nil && time.Until(sent.Add(time.Duration(g.TTL)*time.Second-margin(p.window))) >= p.interval+spareSlack
	if !fit && !p.refilling && !p.isClosed {
		p.refilling = true
		p.bg.Add(1) // while not closed: Close's Wait comes after
		go p.refill()
	}
	if !fit {
		return nil, time.Time{} // none, or too old: it lapses on its own
	}
	return g, sent
}

// refill grants the next spare lease (one try, bounded by hedgeAfter's
// scale: a spare that is slow to come is not waited for).
func (p *Provider) refill() {
	defer p.bg.Done()
	ctx, cancel := context.WithTimeout(p.closed, provkit.CleanupTimeout)
	defer cancel()
	sent := time.Now()
	g, _, err := hedge(ctx, hedgeAfter, time.Time{}, func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
		return p.client.Grant(ctx, int64(p.window/time.Second))
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refilling = false
	if err == nil && !p.isClosed && p.spare == nil {
		p.spare, p.spareSent = g, sent
		return
	}
	if err == nil {
		// Not needed (the provider closed meanwhile): revoke it, best
		// effort; it lapses on its own otherwise.
		p.bg.Add(1)
		go func() {
			defer p.bg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), provkit.CleanupTimeout)
			defer cancel()
			_, _ = p.client.Revoke(ctx, g.ID)
		}()
	}
}

// revokeSpare revokes the spare lease at Close, best effort.
func (p *Provider) revokeSpare() {
	p.mu.Lock()
	g := p.spare
	p.spare = nil
	p.mu.Unlock()
	if g != nil {
		ctx, cancel := context.WithTimeout(context.Background(), provkit.CleanupTimeout)
		defer cancel()
		_, _ = p.client.Revoke(ctx, g.ID)
	}
}

// putSpare makes the etcd lease id, whose entry a release has just
// deleted, the spare, its expiry, as last told, at expiry with a TTL of
// ttl; one already there is kept if it lasts longer (the other lapses).
func (p *Provider) putSpare(id clientv3.LeaseID, expiry time.Time, ttl time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.isClosed {
		return
	}
	sent := expiry.Add(-ttl)
	if p.spare != nil && !p.spareSent.Before(sent) {
		return
	}
	p.spare, p.spareSent = &clientv3.LeaseGrantResponse{ID: id, TTL: int64(ttl / time.Second)}, sent
}

// spareSlack is what a spare must have left before its loss time beyond a
// renewal interval: two hedged tries' worth, so that the first keepalive
// of a lease taken old has time to come back on a loaded machine.
const spareSlack = 2 * hedgeAfter
