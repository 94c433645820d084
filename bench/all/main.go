// Command all is tenace's load tool with every provider family: the
// in-process locks of go run ./bench, and the distributed ones — Redis
// (tenace-redis, redsync, bsm/redislock), PostgreSQL (tenace-pg, its
// no-fencing variant, advisory locks by hand) and etcd (tenace-etcd, etcd's
// concurrency.Mutex) — plus the OpenTelemetry listener (-otel). A
// distributed family with no address given runs on a throwaway server the
// tool starts on free loopback ports and stops after (redis-server;
// PostgreSQL's initdb and postgres, as the postgres user when run as root;
// a one-member etcd).
//
//	go run ./bench/all -providers redis,postgres,etcd  # hand-off and uncontended rate, every family
//	go run ./bench/all -providers redis -redis 127.0.0.1:6379
//	go run ./bench/all -providers postgres -postgres 'host=127.0.0.1 user=postgres sslmode=disable'
//	go run ./bench/all -providers etcd -etcd http://127.0.0.1:2379
//	go run ./bench/all -otel                           # the pipeline with and without the listener
//
// It writes results.md, results.json and chart.svg into bench-results/all/
// (-out elsewhere), so that go run ./bench's bench-results/chart.svg stays.
// It is a command of its own so that go run ./bench compiles none of this.
// A family registers in init: a load.Family with its implementations, its
// address flag and a Start that launches a throwaway server (see
// servers.go).
package main

import (
	"os"

	"tenace.dev/bench/internal/load"
)

// defaultOut is where go run ./bench/all writes its table and chart: beside
// go run ./bench's bench-results/chart.svg, not over it.
const defaultOut = "bench-results/all"

func init() {
	load.DefaultOut = defaultOut
	load.Register(redisFamily())
	load.Register(postgresFamily())
	load.Register(etcdFamily())
	load.AddImpl("memory", load.Impl{Name: otelImpl, Desc: "pipeline with the oteltenace listener on the OpenTelemetry SDK (ManualReader)", Make: newOtelLocker})
}

func main() { os.Exit(load.Run(os.Args[1:], os.Stdout, os.Stderr)) }
