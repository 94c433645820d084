//go:build tenace_mutant_sharedpool

package shard

// mutant sharedpool: the shards of a group share one pool of waiters, as before commit 2e5dbcd.
const mutant = "sharedpool"
