//go:build tenace_mutant_idlekey

package shard

// mutant idlekey: the reaper leaves idle keys' entries in the table.
const mutant = "idlekey"
