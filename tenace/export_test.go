package tenace

import "context"

// WithQueuedHook exposes the test hook that reports queued acquires.
var WithQueuedHook = withQueuedHook

// SyncProvider returns once p's shards have applied every message sent
// before the call; after it, p.Size() is exact.
func SyncProvider(p *MemoryLockProvider) error { return p.sync(context.Background()) }
