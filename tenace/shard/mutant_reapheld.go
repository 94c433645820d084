//go:build tenace_mutant_reapheld

package shard

// mutant reapheld: the reaper deletes an entry held again since its release by CAS.
const mutant = "reapheld"
