# millrace. `make demo` and `make test` need only Go: PostgreSQL is found or
# started by scripts/pg-up.sh, and Kafka is the embedded broker unless
# KAFKA_BROKERS names a real cluster.
SHELL := /bin/bash
GO ?= go
export GOFLAGS ?= -mod=readonly

.PHONY: demo test bench pg-up broker fmt

# The main example, end to end: the order saga across four services
# (examples/ordersaga), faults on. Flags pass through DEMOFLAGS:
# make demo DEMOFLAGS="-sagas 2000 -keep". Exits 1 if a check fails. It
# builds first, saying so: a cold build is silent for about half a minute.
# The outbox-only example: go run ./examples/outbox.
demo:
	@url="$$(scripts/pg-up.sh)" || exit 1; \
	dir="$$(mktemp -d)" || exit 1; trap 'rm -rf "$$dir"' EXIT; \
	echo "demo: building examples/ordersaga (a first build takes about half a minute)..." >&2; \
	$(GO) build -o "$$dir/demo" ./examples/ordersaga || exit 1; \
	echo "demo: built; running" >&2; \
	DATABASE_URL="$$url" "$$dir/demo" $(DEMOFLAGS)

# The console's browser test drives the Chromium that scripts/chromium.sh
# finds or installs (as root); without one it is skipped, with the reason.
test:
	@url="$$(scripts/pg-up.sh)" && chromium="$$(scripts/chromium.sh)" && \
	echo "go vet ./..." && $(GO) vet ./... && \
	echo "go test -race ./..." && DATABASE_URL="$$url" CHROMIUM_PATH="$$chromium" $(GO) test -race -timeout 12m ./...

# The benchmarks (each figure beside its target) into bench/results.json; BENCH_QUICK=1
# for a run under a minute.
bench:
	@url="$$(scripts/pg-up.sh)" && DATABASE_URL="$$url" $(GO) run ./cmd/millrace-bench -out bench/results.json

pg-up:
	@scripts/pg-up.sh

broker:
	$(GO) run ./cmd/millrace-kafka

fmt:
	gofmt -l -w .
