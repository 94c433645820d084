package shard

import (
	"context"
	"slices"
	"time"
)

// AcquireAll acquires every key of keys, all or none: one at a time, each
// from its shard as [Shard.Acquire] does, in sorted (byte) order — the one
// order every caller of the group uses, so that two sets never wait for each
// other forever, whatever order their callers named the keys in. keys must
// be distinct.
//
// It returns the keys in the order acquired and, when every key was
// granted, their grants in that order. It returns no grants, and a nil
// error, when mode is Try and a key is held, or when timeout delivers
// first: one channel for the whole set, so it bounds the whole wait; ctx's
// error when ctx ends first; ErrStopped when the group is stopped. Whenever
// it returns no grants, none of the keys is held: the keys granted before
// the give-up are released before it returns — by the same compare-and-swap
// or message as any release — and the key it was waiting for was left as
// Shard.Acquire leaves it (abort during grant included).
//
// Why sorted keys and not one message per shard granting a shard's keys
// together: a per-shard grant would still have to order the shards, and
// it would make a set wait in several queues at once, which the table's
// FIFO queues, one waiter per queue, do not model. A set of n keys costs n
// acquires, as n nested locks would.
//
// r, when not nil, gives every key's acquire its label, and reports the
// holder of the key that refused the set or kept it waiting past its
// timeout, as [Shard.AcquireWith] does; r.Shared must be false.
func (g *Group) AcquireAll(ctx context.Context, keys []string, r *Request, mode Mode, timeout <-chan time.Time) (order []string, grants []*Grant, err error) {
	if r != nil {
		r.Holder, r.HolderSeen = HolderView{}, false
	}
	order = Order(keys)
	grants = make([]*Grant, 0, len(order))
	for _, key := range order {
		out, err := g.For(key).acquire(ctx, key, r, mode, timeout)
		if err != nil || !out.Granted {
			// The last first: the reverse of the order taken.
			for i := len(grants) - 1; i >= 0; i-- {
				grants[i].Release()
			}
			return order, nil, err
		}
		grants = append(grants, out.Grant())
	}
	return order, grants, nil
}

// Order returns keys in the order AcquireAll acquires them: sorted, in a
// new slice.
func Order(keys []string) []string { return slices.Sorted(slices.Values(keys)) }
