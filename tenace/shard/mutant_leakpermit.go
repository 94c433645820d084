//go:build tenace_mutant_leakpermit

package shard

// mutant leakpermit: a shared grant raced by its cancel keeps its permit.
const mutant = "leakpermit"
