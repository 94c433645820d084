package tenace

import (
	"context"

	"tenace.dev/tenace/shard"
)

// WithQueuedHook exposes the test hook that reports queued acquires.
var WithQueuedHook = withQueuedHook

// SyncProvider returns once p's shards have applied every message sent
// before the call; after it, p.Size() is exact.
func SyncProvider(p *MemoryLockProvider) error { return p.sync(context.Background()) }

// BareLeaseContext is a memory lease's Grant seen as a context without the
// Lock having set its parent (which a Lock never hands out).
func BareLeaseContext() context.Context { return (*grantContext)(&shard.Grant{}) }
