//go:build tenace_mutant_lifo

package shard

// mutant lifo: grants the newest waiter first instead of the oldest.
const mutant = "lifo"
