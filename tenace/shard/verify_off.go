//go:build !tenace_verify

package shard

// verify turns on the invariant check after every message; build with
// -tags tenace_verify to enable it.
const verify = false
