# toolfence — see README.md. Every target installs what it needs (Go modules) itself.
GO       ?= go
PKGS     ?= ./...
P        ?= 2
BENCHTIME ?= 2s
COUNT    ?= 6
export TOOLFENCE_TEST_PG ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable

.PHONY: all build demo check test bench benchvs lint fuzz jepsen clean

all: build

build:
	$(GO) build -p $(P) -o bin/toolfence ./cmd/toolfence

## demo: the crash-and-hand-over story on the embedded badger store.
demo: build
	./bin/toolfence demo

## check: the fast loop (docs/development.md), no services needed: the repository holds no
## binary or large file, gofmt, go vet, staticcheck, go.mod and go.sum tidy, then the tests
## with -short (every test that needs a service or runs long skips); then the same in the
## examples/consumer module.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.7.0
check: lint
	scripts/checkrepo.sh
	$(GO) run $(STATICCHECK) $(PKGS)
	$(GO) mod tidy -diff
	$(GO) test -short -p $(P) -timeout 10m $(PKGS)
	cd examples/consumer && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./... && $(GO) mod tidy -diff && \
	  $(GO) test -short -p $(P) -timeout 5m ./...

## test: every test, with the race detector. Needs PostgreSQL (see README). examples/consumer
## is a module of its own (so that nats.go stays out of toolfence's go.mod): its tests run too.
test:
	$(GO) mod download
	$(GO) vet -p $(P) $(PKGS)
	$(GO) test -race -p $(P) -count=1 -timeout 20m $(PKGS)
	cd examples/consumer && $(GO) vet ./... && $(GO) test -race -p $(P) -count=1 -timeout 5m ./...

## bench: the benchmarks of docs/benchmarks.md in COUNT interleaved rounds (each round runs
## every package's benchmarks once, so a target's ratio compares neighbours in time), then
## benchstat and the verdict on every target (internal/checks/benchcheck).
BENCHPKGS ?= interceptor ledger/badger ledger/postgres internal/checks/proxybench
bench:
	@mkdir -p bin/bench
	@for p in $(BENCHPKGS); do $(GO) test -c -o bin/bench/$$(echo $$p | tr / -).test ./$$p/ || exit 1; done
	@rm -f bench.out; for i in $$(seq $(COUNT)); do \
	  for p in $(BENCHPKGS); do \
	    echo "bench: round $$i of $(COUNT): $$p" >&2; \
	    (cd $$p && $(CURDIR)/bin/bench/$$(echo $$p | tr / -).test -test.run '^$$' -test.bench . \
	      -test.benchtime $(BENCHTIME) -test.benchmem) >> bench.out || exit 1; \
	  done; \
	done
	$(GO) run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da bench.out
	$(GO) run ./internal/checks/benchcheck bench.out

## benchvs: this working tree against an older commit (BASE), on the same machine in one run
## (scripts/benchvs.sh): BENCHPKGS's test binaries built at BASE and here, run in COUNT
## interleaved rounds (BENCH selects the benchmarks), then every benchmark's time here ÷ at
## BASE per round and the median (benchcheck -base). Issue 27's comparison:
##   make benchvs BASE=ba171e9 BENCHPKGS=ledger/postgres BENCH='^BenchmarkPostgresGuardedCall(Parallel)?$' COUNT=4
## BENCH reaches the test binaries as written (make expands nothing in it), so a `$` may be
## followed by a sub-benchmark: BENCH='^BenchmarkPostgresGuardedCallParallel$/^callers=8$'.
BASE  ?= ba171e9
BENCH ?= .
benchvs:
	BASE='$(BASE)' BENCHPKGS='$(BENCHPKGS)' BENCH='$(value BENCH)' COUNT='$(COUNT)' BENCHTIME='$(BENCHTIME)' GO='$(GO)' scripts/benchvs.sh

## lint: formatting and vet.
lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt: files above need formatting'; exit 1; }
	$(GO) vet -p $(P) $(PKGS)

## fuzz: run each fuzz target for FUZZTIME (crashers land in testdata/fuzz and become regression seeds).
FUZZTIME ?= 60s
fuzz:
	$(GO) test ./residual/ -run '^$$' -fuzz FuzzCanonical -fuzztime $(FUZZTIME)

## jepsen: the long fault runs of docs/reliability.md: JEPSEN_DURATION of workload per backend
## (10 minutes by default; PostgreSQL needs initdb and pg_ctl on PATH), then the checks. Reports
## land in jepsen-out/<backend>; the exit status is 1 when a verdict is not clean.
JEPSEN_DURATION ?= 10m
JEPSEN_BACKENDS ?= badger,postgres
jepsen: build
	nice -n 10 ./bin/toolfence jepsen --backend $(JEPSEN_BACKENDS) --duration $(JEPSEN_DURATION) --dir jepsen-out

clean:
	rm -rf bin .toolfence bench.out benchvs-base.out benchvs-head.out jepsen-out
