//go:build tenace_verify

package shard

// verify turns on the invariant check after every message applied, and
// widens the race windows that tests must meet (see Table.ReleaseByCAS).
const verify = true
