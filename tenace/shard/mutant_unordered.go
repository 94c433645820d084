//go:build tenace_mutant_unordered

package shard

// mutant unordered: a set takes its keys in the order its caller named them.
const mutant = "unordered"
