//go:build tenace_mutant_doublegrant

package shard

// mutant doublegrant: grants a NoWait acquire on a held key: two holders.
const mutant = "doublegrant"
