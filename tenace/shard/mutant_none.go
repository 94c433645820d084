//go:build !tenace_mutant_lifo && !tenace_mutant_leakcancel && !tenace_mutant_stalerelease && !tenace_mutant_idlekey && !tenace_mutant_doublegrant && !tenace_mutant_ghostwaiter && !tenace_mutant_casignoreswaiters && !tenace_mutant_reapheld && !tenace_mutant_sharedpool && !tenace_mutant_unordered && !tenace_mutant_partialrelease && !tenace_mutant_writerbesidereader && !tenace_mutant_leakpermit

package shard

// mutant names the deliberately broken variant of the table this build
// compiles, for package fuzz's mutation check (scripts/mutants); "" in
// every normal build. Each mutant is one build tag, tenace_mutant_<name>,
// and a constant: the compiler drops every mutant branch when it is "".
const mutant = ""
