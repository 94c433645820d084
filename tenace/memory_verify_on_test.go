//go:build tenace_verify

package tenace_test

// verifying: the shards check the whole table after every message, so
// tests of many keys keep their key count small.
const verifying = true
