//go:build tenace_mutant_writerbesidereader

package shard

// mutant writerbesidereader: a writer is admitted beside the key's readers.
const mutant = "writerbesidereader"
