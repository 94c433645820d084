//go:build tenace_mutant_stalerelease

package shard

// mutant stalerelease: lets a release with a stale token free the current holder.
const mutant = "stalerelease"
