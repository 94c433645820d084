//go:build tenace_mutant_partialrelease

package shard

// mutant partialrelease: a set that gives up keeps the first key it was granted.
const mutant = "partialrelease"
