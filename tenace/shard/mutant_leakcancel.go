//go:build tenace_mutant_leakcancel

package shard

// mutant leakcancel: keeps a grant that raced its waiter's cancel: the lock leaks.
const mutant = "leakcancel"
