package etcdlock

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"tenace.dev/tenace"
)

// LeaseID is the etcd lease behind l.
func LeaseID(l tenace.LockLease) clientv3.LeaseID { return l.(*lease).id }

// EtcdKey is l's key in etcd.
func EtcdKey(l tenace.LockLease) string { return l.(*lease).name }

// Dir is the etcd prefix of key's queue.
func (p *Provider) Dir(key string) string { return p.dir(key) }

// SetBeforeWatch sets a hook that runs in a waiter after it read its
// predecessor and before it watches it, with the revision the watch starts
// from; call it before p's first Acquire.
func (p *Provider) SetBeforeWatch(f func(rev int64)) { p.beforeWatch = f }

// SetBeforeTry sets a hook that runs at each try of the queueing ("queue")
// and of a release's delete ("release"), with the try's context and its
// number from 1; call it before p's first Acquire.
func (p *Provider) SetBeforeTry(f func(ctx context.Context, req string, try int32)) { p.beforeTry = f }

// Spare is p's spare etcd lease, 0 when it has none.
func (p *Provider) Spare() clientv3.LeaseID {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.spare == nil {
		return 0
	}
	return p.spare.ID
}
