# tenace for Go. `make test` is what CI runs (.ci/run).
GO       ?= go
FUZZTIME ?= 30s
# Every module of the workspace (go.work); ./... alone covers only the core.
# The distributed providers: tested one package at a time (see test-race).
DISTRIBUTED := ./tenace/redislock/... ./tenace/pglock/... ./tenace/etcdlock/...
PKGS     := ./... ./bench/... ./cmd/tenace/... ./tenace/redislock/... ./tenace/oteltenace/... ./tenace/pglock/... ./tenace/etcdlock/... ./tenace/failsafelock/... ./tenace/lockhttp/... ./scripts/releaseproxy/... ./scripts/adopter/...

# The distributed providers' tests need redis-server, postgresql with pgbouncer, and
# etcd: as root with apt-get, make test installs what is missing; otherwise it runs
# every test it can (the distributed ones skip), then fails with the install line.
.PHONY: servers test test-busy test-race test-allocs test-verify test-mutants-apply release-check bench bench-quick bench-ratios bench-engines fuzz mutants lint cover run

# The parts of make test, in order.
TEST_PARTS := test-race test-allocs test-verify test-mutants-apply release-check

## test: everything CI checks, on every module. Every part runs, also after
## one fails, and a summary ends the output: each part's status and time;
## it fails if any part failed or a server is missing.
test: servers
	@failed=; summary=; \
	for t in $(TEST_PARTS); do \
		start=$$(date +%s); \
		if $(MAKE) --no-print-directory $$t; then r=ok; else r=FAILED; failed="$$failed $$t"; fi; \
		summary="$$summary$$(printf '\n  %-14s %-6s %5ss' $$t $$r $$(($$(date +%s) - start)))"; \
	done; \
	./scripts/servers check || failed="$$failed servers"; \
	echo "make test:$$summary"; \
	if [ -n "$$failed" ]; then echo "make test: FAILED:$$failed"; exit 1; fi; \
	echo "make test: passed"

## test-busy: make test with one CPU burner per core (BUSY=N: N) running throughout,
## as on a shared CI runner; scripts/busy stops exactly those burners after, pass or fail
BUSY ?=
test-busy:
	./scripts/busy run $(BUSY) -- $(MAKE) --no-print-directory test

## servers: install the test servers that are missing (root with apt-get), or say how
servers:
	@./scripts/servers install

# Under make -j, nothing tests before the servers are installed.
test-race test-allocs test-verify release-check: servers

## test-race: every test of every module under the race detector; the distributed
## providers' packages one at a time (their fault tests stall servers and run CPU
## burners, and measure timing bounds that another package's burners would skew)
test-race:
	$(GO) test -race -count=1 $(filter-out $(DISTRIBUTED),$(PKGS)); s=$$?; \
	$(GO) test -race -count=1 -p 1 $(DISTRIBUTED) && exit $$s

## test-allocs: the allocation budgets (sync.Pool drops items under -race, so they run without it)
test-allocs:
	$(GO) test -count=1 -run 'Alloc' ./tenace/... ./tenace/oteltenace/...

## test-verify: the lock manager with the table's invariant check after every message
test-verify:
	$(GO) test -race -count=1 -tags tenace_verify ./tenace/ ./tenace/shard/

## test-mutants-apply: every mutant patch of scripts/mutants.d still applies to
## the tree (make mutants runs them; a change to the code they break can stale them)
test-mutants-apply:
	@for p in scripts/mutants.d/*.patch; do \
		git apply --check "$$p" || { echo "$$p no longer applies: regenerate it against the tree (scripts/mutants says how)"; exit 1; }; \
	done; echo "test-mutants-apply: every mutant patch applies"

## release-check: the adopter module (scripts/adopter), outside the workspace, builds and tests against the modules zipped as published
release-check:
	./scripts/release-check

## run: the load tool on the in-process provider (the README's first command)
run:
	$(GO) run ./bench

## bench: every benchmark, with allocations
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./tenace/ ./bench/ ./bench/all/

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

## bench-ratios: tenace ÷ the semaphore map, interleaved rounds, median ratios against issue 37's targets
bench-ratios:
	./scripts/benchratios

## bench-engines: each distributed provider ÷ the hand-written lock on its engine (uncontended) and ÷ the fastest peer (hand-off), median of interleaved rounds, against issue 35's targets
bench-engines: servers
	./scripts/engineratios

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
