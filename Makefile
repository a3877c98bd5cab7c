# millrace. `make demo` and `make test` need only Go: PostgreSQL is found or
# started by scripts/pg-up.sh, and Kafka is the embedded broker unless
# KAFKA_BROKERS names a real cluster.
SHELL := /bin/bash
GO ?= go
export GOFLAGS ?= -mod=readonly

.PHONY: demo test vet bench bench-quick pg-up broker fmt

# DATABASE_URL is resolved once per make run.
DBURL = $(shell scripts/pg-up.sh)

# The main example, end to end (examples/outbox). Flags pass through DEMOFLAGS:
# make demo DEMOFLAGS="-orders 20000 -keep". Exits 1 if a check fails.
demo:
	@url="$$(scripts/pg-up.sh)" && DATABASE_URL="$$url" $(GO) run ./examples/outbox $(DEMOFLAGS)

test:
	@url="$$(scripts/pg-up.sh)" && \
	echo "go vet ./..." && $(GO) vet ./... && \
	echo "go test -race ./..." && DATABASE_URL="$$url" $(GO) test -race -timeout 12m ./...

bench:
	DATABASE_URL="$(DBURL)" $(GO) run ./cmd/millrace-bench -out bench/results.json

pg-up:
	@scripts/pg-up.sh

broker:
	$(GO) run ./cmd/millrace-kafka

fmt:
	gofmt -l -w .
