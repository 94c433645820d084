//go:build tenace_mutant_idlekey

package shard

// mutant idlekey: leaves an idle key's entry in the table.
const mutant = "idlekey"
