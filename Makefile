# tenace for Go. `make test` is what CI runs (.ci/run).
GO       ?= go
FUZZTIME ?= 30s
# Every module of the workspace (go.work); ./... alone covers only the core.
PKGS     := ./... ./bench/... ./tenace/redislock/... ./tenace/oteltenace/... ./tenace/pglock/... ./tenace/etcdlock/... ./tenace/failsafelock/...

# The Redis tests need redis-server, the PostgreSQL tests postgresql and pgbouncer; as root, make test installs them.
.PHONY: ensure-redis ensure-postgres test test-race test-allocs test-verify bench bench-quick fuzz mutants lint cover run

## test: everything CI checks, on every module
test: test-race test-allocs test-verify

## ensure-redis: install redis-server if it is missing (root), or say what to install
ensure-redis:
	@command -v redis-server >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing redis-server (apt-get)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
		else \
			echo "make test needs redis-server: run 'sudo apt-get install redis-server'"; exit 1; \
		fi; }

## ensure-postgres: install postgresql and pgbouncer if missing (root), or say what to install
ensure-postgres:
	@{ ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null 2>&1; } && \
	{ [ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null 2>&1; } || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing postgresql and pgbouncer (apt-get)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql pgbouncer >/dev/null; \
		else \
			echo "make test needs postgresql and pgbouncer: run 'sudo apt-get install postgresql pgbouncer'"; exit 1; \
		fi; }

## test-race: every test of every module under the race detector
test-race: ensure-redis ensure-postgres
	$(GO) test -race -count=1 $(PKGS)

## test-allocs: the allocation budgets (sync.Pool drops items under -race, so they run without it)
test-allocs:
	$(GO) test -count=1 -run 'Alloc' ./tenace/... ./tenace/oteltenace/...

## test-verify: the lock manager with the table's invariant check after every message
test-verify:
	$(GO) test -race -count=1 -tags tenace_verify ./tenace/ ./tenace/shard/

## run: the load tool on the in-process provider (the README's first command)
run:
	$(GO) run ./bench

## bench: every benchmark, with allocations
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./tenace/ ./bench/

## bench-quick: the named subset for before/after comparisons with benchstat (< 5 min)
bench-quick:
	$(GO) test -run '^$$' -count 6 -benchmem \
		-bench 'Floor|Lock/^(tenace|semaphore|pipeline)$$/^(distinct|hot|zipf|cancel)$$/^g=(1|256)$$' ./bench/

## fuzz: each fuzz target for FUZZTIME, one after another
fuzz:
	@set -e; for t in $$($(GO) test -list 'Fuzz.*' ./fuzz/ | grep '^Fuzz'); do \
		echo "== $$t ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 10s ./fuzz/; \
	done

## mutants: run the fuzz targets against each deliberately broken lock manager
mutants:
	./scripts/mutants

## lint: go vet, gofmt and (when installed) staticcheck over every module
lint:
	$(GO) vet $(PKGS)
	@if command -v staticcheck >/dev/null 2>&1; then staticcheck $(PKGS); \
	else echo "staticcheck not installed (go install honnef.co/go/tools/cmd/staticcheck@latest): skipped"; fi
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

## cover: coverage of the core packages
cover:
	$(GO) test -count=1 -coverpkg=./tenace/...,./internal/... -coverprofile=cover.out ./tenace/... ./fuzz/
	$(GO) tool cover -func=cover.out | tail -1
