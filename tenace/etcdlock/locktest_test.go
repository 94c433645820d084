package etcdlock_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"tenace.dev/tenace"
	"tenace.dev/tenace/etcdlock"
	"tenace.dev/tenace/locktest"
)

// TestConformance runs the provider contract with every capability:
// FIFO holds by create revision, and a waiter counts in Stats once its
// place in etcd's queue is fixed. Each provider value has a client of its
// own, as processes do. Lose revokes the lease's etcd lease from outside.
func TestConformance(t *testing.T) {
	c := cluster(t)
	admin := newClient(t, c.Endpoints()...)
	locktest.Run(t, func(t *testing.T) tenace.LockProvider {
		return newProvider(t, newClient(t, c.Endpoints()...))
	}, locktest.Capabilities{
		FIFO:       true,
		ExactStats: true,
		Fencing:    true,
		Losable:    true,
		TTL:        true,
		Close:      true,
		Shared:     true,
		ReadWrite:  true,
		Permits:    true,
		// A waiter is an entry in the key's queue.
		InspectWaiters: true,
		Lose: func(t *testing.T, l tenace.LockLease) {
			_, err := admin.Revoke(bg, etcdlock.LeaseID(l))
			require.NoError(t, err)
		},
	})
}
