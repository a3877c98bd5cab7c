# millrace. `make demo` needs only Go: PostgreSQL is found or started by
# scripts/pg-up.sh, and Kafka is the embedded broker unless KAFKA_BROKERS
# names a real cluster. `make test` also brings up RabbitMQ and a three-node
# Apache Kafka cluster (scripts/rabbitmq-up.sh, scripts/kafka-up.sh; Java and
# Maven fetch the broker once).
SHELL := /bin/bash
GO ?= go
export GOFLAGS ?= -mod=readonly

# The packages whose tests talk to a broker: the real-Kafka tier runs them
# again against the three-node cluster. internal/realkafka holds the tests
# that kill broker nodes; it runs alone, after the others.
KAFKA_PKGS ?= . ./kafka/ ./outbox/ ./inbox/ ./compensation/ ./saga/ ./internal/tracing/ ./internal/devkafka/ ./internal/polyglot/ ./internal/conform/ ./examples/...
FAILOVER_PKGS ?= ./internal/realkafka/ ./examples/ordersaga/

.PHONY: demo demo-polyglot test test-embedded test-kafka test-polyglot python-venv bench bench-kafka bench-scale bench-debezium pg-up kafka-up kafka-down broker fmt

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

# The same demo with its payment service in Python (examples/ordersaga/payment.py,
# on python/'s millrace package), killed and restarted once mid-run besides
# the demo's faults. The first run makes the Python environment
# (scripts/python-venv.sh, about a minute).
demo-polyglot:
	@url="$$(scripts/pg-up.sh)" || exit 1; py="$$(scripts/python-venv.sh)" || exit 1; \
	dir="$$(mktemp -d)" || exit 1; trap 'rm -rf "$$dir"' EXIT; \
	echo "demo: building examples/ordersaga (a first build takes about half a minute)..." >&2; \
	$(GO) build -o "$$dir/demo" ./examples/ordersaga || exit 1; \
	DATABASE_URL="$$url" "$$dir/demo" -payment-cmd "PYTHONPATH='$(CURDIR)/python' '$$py' '$(CURDIR)/examples/ordersaga/payment.py'" $(DEMOFLAGS)

# Two tiers. First the whole suite on the embedded broker (go vet, also of
# the module examples/oidc, then go test -race ./...), then the real-Kafka tier: KAFKA_PKGS and then the
# failover tests against the cluster scripts/kafka-up.sh starts (or reuses).
# The console's browser test drives the Chromium that scripts/chromium.sh
# finds or installs (as root).
test: test-embedded test-kafka test-polyglot

test-embedded:
	@url="$$(scripts/pg-up.sh)" && amqp="$$(scripts/rabbitmq-up.sh)" && redis="$$(scripts/redis-up.sh)" && nats="$$(scripts/nats-up.sh)" && chromium="$$(scripts/chromium.sh)" && \
	echo "go vet ./..." && $(GO) vet ./... && \
	echo "go vet examples/oidc (the console's OIDC recipe, a module of its own)" && (cd examples/oidc && $(GO) vet ./...) && \
	echo "tier 1, embedded broker: go test -race ./..." && \
	DATABASE_URL="$$url" AMQP_URL="$$amqp" REDIS_URL="$$redis" NATS_URL="$$nats" CHROMIUM_PATH="$$chromium" $(GO) test -race -timeout 12m ./...

test-kafka:
	@url="$$(scripts/pg-up.sh)" && brokers="$$(scripts/kafka-up.sh)" && brokers="$${brokers#KAFKA_BROKERS=}" && \
	echo "tier 2, Apache Kafka at $$brokers: go test -race $(KAFKA_PKGS)" && \
	DATABASE_URL="$$url" KAFKA_BROKERS="$$brokers" $(GO) test -race -timeout 15m $(KAFKA_PKGS) && \
	echo "tier 2, failover (nodes killed and restarted): go test $(FAILOVER_PKGS)" && \
	DATABASE_URL="$$url" KAFKA_BROKERS="$$brokers" MILLRACE_FAILOVER=1 $(GO) test -p 1 -timeout 15m -run Failover $(FAILOVER_PKGS)

# Participants in other languages (docs/protocol.md): the conformance kit
# against the Go participant and the Python one (python/), each on the
# embedded broker and on the three-node cluster, then pytest against
# PostgreSQL and the cluster. The Python environment comes from
# scripts/python-venv.sh (made once, outside the repository). The last line
# counts the kit's cases and pytest's tests: "polyglot: N passed, M failed".
# (internal/polyglot, a saga through a Python participant end to end, runs in
# the Go tiers.)
test-polyglot:
	@url="$$(scripts/pg-up.sh)" && brokers="$$(scripts/kafka-up.sh)" && brokers="$${brokers#KAFKA_BROKERS=}" && \
	py="$$(scripts/python-venv.sh)" && dir="$$(mktemp -d)" && trap 'rm -rf "$$dir"' EXIT && \
	$(GO) build -o "$$dir/millrace" ./cmd/millrace && \
	export DATABASE_URL="$$url" PYTHONPATH="$(CURDIR)/python" && \
	passed=0; failed=0; run=$$(date +%s); \
	for tier in embedded cluster; do \
		for who in go python; do \
			case $$who in go) cmd="$$dir/millrace conform go-participant";; python) cmd="$$py -m millrace.conform";; esac; \
			b=""; [ $$tier = cluster ] && b="$$brokers"; \
			echo "polyglot: conformance kit, $$who participant, $$tier broker"; \
			KAFKA_BROKERS="$$b" "$$dir/millrace" conform participant --schema "conform_$${who}_$${tier}_$$run" \
				--topic "conform.$$who.$$tier.$$run" --run "$$cmd" | tee "$$dir/kit.out"; \
			line="$$(grep -E '^[0-9]+ passed, [0-9]+ failed$$' "$$dir/kit.out" | tail -1)"; \
			[ -n "$$line" ] || { failed=$$((failed + 1)); continue; }; \
			set -- $$line; passed=$$((passed + $$1)); failed=$$((failed + $$3)); \
		done; \
	done; \
	echo "polyglot: pytest python/tests against PostgreSQL and Apache Kafka at $$brokers"; \
	(cd python && KAFKA_BROKERS="$$brokers" "$$py" -m pytest -q -p no:cacheprovider tests) | tee "$$dir/pytest.out"; \
	p="$$(grep -oE '[0-9]+ passed' "$$dir/pytest.out" | tail -1 | cut -d' ' -f1)"; \
	f="$$(grep -oE '[0-9]+ (failed|errors?)' "$$dir/pytest.out" | awk '{n += $$1} END {print n + 0}')"; \
	[ -n "$$p" ] || failed=$$((failed + 1)); \
	passed=$$((passed + $${p:-0})); failed=$$((failed + $${f:-0})); \
	echo "polyglot: $$passed passed, $$failed failed"; \
	[ $$failed -eq 0 ]

# The Python environment of python/ (scripts/python-venv.sh); prints its python.
python-venv:
	@scripts/python-venv.sh

# The benchmarks (each figure beside its target) into bench/results.json; BENCH_QUICK=1
# for a run under a minute.
bench:
	@url="$$(scripts/pg-up.sh)" && DATABASE_URL="$$url" $(GO) run ./cmd/millrace-bench -out bench/results.json

# The same figures against the three-node cluster, into bench/results-kafka.json.
bench-kafka:
	@url="$$(scripts/pg-up.sh)" && brokers="$$(scripts/kafka-up.sh)" && \
	DATABASE_URL="$$url" KAFKA_BROKERS="$${brokers#KAFKA_BROKERS=}" $(GO) run ./cmd/millrace-bench -out bench/results-kafka.json

# Operating at scale: a million sagas and ten million history rows, the
# operator's reads timed with their plans, a retention pass with
# pg_stat_user_tables before and after, into bench/results-scale.json.
bench-scale:
	@url="$$(scripts/pg-up.sh)" && DATABASE_URL="$$url" $(GO) run ./cmd/millrace-bench -only scale -out bench/results-scale.json

# Debezium's PostgreSQL connector with its outbox event router (Kafka Connect
# standalone; Java and Maven fetch it once) on the same table shape, backlog
# and cluster, into bench/results-debezium.json (bench/README.md, Debezium).
bench-debezium:
	@url="$$(scripts/pg-up.sh)" && brokers="$$(scripts/kafka-up.sh)" && \
	DATABASE_URL="$$url" KAFKA_BROKERS="$${brokers#KAFKA_BROKERS=}" bench/debezium/run.sh

pg-up:
	@scripts/pg-up.sh

# The three-node Apache Kafka cluster of the real-Kafka tier; prints
# KAFKA_BROKERS=... . kafka-down stops it.
kafka-up:
	@scripts/kafka-up.sh

kafka-down:
	@scripts/kafka-down.sh

broker:
	$(GO) run ./cmd/millrace-kafka

fmt:
	gofmt -l -w .
