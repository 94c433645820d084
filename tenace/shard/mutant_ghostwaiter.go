//go:build tenace_mutant_ghostwaiter

package shard

// mutant ghostwaiter: leaves a cancelled waiter in the queue.
const mutant = "ghostwaiter"
