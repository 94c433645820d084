//go:build tenace_verify

package shard

// verify turns on the invariant check after every message applied.
const verify = true
