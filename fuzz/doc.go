// Package fuzz holds the project's coverage-guided fuzz targets, in
// fuzz_test.go:
//
//   - FuzzTable: bytes decode into acquires, tries, releases (current and
//     stale tokens) and cancels on a shard.Table over a few keys; after every
//     step the table's invariants and a plain FIFO model must agree.
//   - FuzzSharedTable: the same with shared requests and permit counts (0
//     to 3) beside exclusive ones; never more shared holders than permits,
//     never an exclusive holder beside anyone, FIFO admission, and a shared
//     grant raced by its cancel gives its permit back.
//   - FuzzProvider: bytes decode into a concurrent schedule on a
//     MemoryLockProvider — goroutines that acquire, hold, release, time out,
//     cancel, race a release against a cancel, and acquire again on
//     another shard right after a give-up that raced its grant — run in a
//     testing/synctest bubble, so time is fake and each step ends when every
//     goroutine is blocked. Mutual exclusion, FIFO order, exact Size, no
//     leaked lock, and (goleak) no goroutine left.
//   - FuzzPolicy: bytes decode into a pipeline shape (lock with or without a
//     key, timeouts inside or outside it, a nested lock with a distinct key)
//     and one execution; the error, whether fn ran and the events must be
//     what SPEC.md's table says.
//   - FuzzSets: bytes decode into sets of keys, named in any order,
//     acquired with AcquireAll on both its paths, held, released, timed out
//     and cancelled (all or nothing, no deadlock between sets, nothing
//     left held); and, read a second time, into executions nesting Lock
//     steps on keys and sets with no Timeout, some started from contexts
//     kept past their Lock: every *DeadlockError justified (the key held,
//     or a cycle of waits, a set's granted keys counting as held), no
//     cycle left standing.
//
// The properties are the same ones the unit tests check with rapid.Check
// (package internal/proptest): rapid.MakeFuzz turns each into a
// native fuzz target. The seed corpus in testdata/fuzz runs with every
// go test, so make test runs it too. make fuzz fuzzes each target for
// FUZZTIME; make mutants shows that the targets catch deliberately broken
// lock managers (see scripts/mutants).
package fuzz
