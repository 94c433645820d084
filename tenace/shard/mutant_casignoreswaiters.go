//go:build tenace_mutant_casignoreswaiters

package shard

// mutant casignoreswaiters: a holder's CAS frees its key even when waiters queue for it.
const mutant = "casignoreswaiters"
