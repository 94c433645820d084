// Command bench is tenace's load tool for the in-process locks: tenace's
// MemoryLockProvider and the keyed locks Go developers use today, through
// contention scenarios. It prints a table — throughput, acquire latency
// percentiles, ratios to tenace and to the design's floor, a
// mutual-exclusion check — and writes it with a chart into bench-results/.
//
//	go run ./bench                 # the comparison matrix, about a minute
//	go run ./bench -impl tenace,semaphore -scenario hot -goroutines 64 -hold 10us
//	go run ./bench -out results    # the table and chart elsewhere (-out "": none)
//	go run ./bench -busy 2         # every cell beside 2 goroutines that burn CPU
//
// The distributed providers (Redis, PostgreSQL) and the OpenTelemetry
// listener are in go run ./bench/all, so that this command compiles only
// what it runs. The Go benchmarks of the same implementations are in
// bench_test.go: go test ./bench -bench . -benchmem.
package main

import (
	"os"

	"tenace.dev/bench/internal/load"
)

func main() { os.Exit(load.Run(os.Args[1:], os.Stdout, os.Stderr)) }
