# Strata: `make run` starts a single-node broker, `make test` runs the test suite.
# Both set up everything they need (virtualenv, Python and Debian packages) on a fresh machine.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run run-cluster bench-failover bench-topic-creation bench-netfaults bench-replication bench-transactions bench-rejoin faults faults-txn faults-tiered faults-net test test-fast fuzz bench bench-smoke bench-log bench-acl bench-cleaner bench-offsets-restart bench-spark bench-tls bench-authz venv system-deps kafka-dist spark-kafka-dist clean

$(STAMP): pyproject.toml benchmarks/pyproject.toml
	@bash scripts/system-deps.sh build
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,spark]' -e ./benchmarks
	touch $@

venv: $(STAMP)

# Debian packages the tests use (kcat is used once the broker exists; MIT Kerberos's KDC, client
# and headers for the GSSAPI tests and python-gssapi's build). Skipped when present.
system-deps:
	@bash scripts/system-deps.sh

# Apache Kafka 4.x jars from Maven Central (for DumpLogSegments and the CLI tools).
kafka-dist:
	@bash scripts/kafka-dist.sh >/dev/null || echo "kafka-dist: not installed (Java/Maven missing?); Kafka tool tests will be skipped"

# Spark's Kafka connector (spark-sql-kafka-0-10 for the installed PySpark) and the jars it needs
# beyond PySpark's own, from Maven Central (for the connector compatibility tests and bench-spark).
spark-kafka-dist: venv
	@bash scripts/spark-kafka-dist.sh >/dev/null || echo "spark-kafka-dist: not installed (Java/Maven missing?); Spark Kafka connector tests will be skipped"

run: venv
	$(VENV)/bin/strata serve --config config/server.properties

# ZooKeeper and three brokers (ports 9092-9094) with zookeeper.connect set; data under data/cluster/.
run-cluster: venv system-deps
	@bash scripts/run-cluster.sh

# The benchmark harnesses' own tests (tests/bench/, the `bench` marker) run in `make bench-smoke`,
# which CI (.ci/run) runs after `make test`.
# Test files run on TEST_WORKERS pytest-xdist workers (--dist loadfile: a file's tests stay on
# one worker, in order): the integration tests mostly wait on brokers and clients, so four
# workers on two cores take about half the time of one. TEST_WORKERS=0 runs them in-process.
TEST_WORKERS ?= 4
test: venv system-deps kafka-dist spark-kafka-dist
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not faults and not faults_net and not bench" --durations=25

test-fast: venv
	$(VENV)/bin/pytest -q -m "not slow and not bench"

# The bad-input tests for long: mutated real client requests for STRATA_FUZZ_SECONDS (900 here,
# 20 in `make test`) and 5,000 hypothesis examples per property (200 in `make test`).
fuzz: venv
	STRATA_FUZZ_SECONDS=$${STRATA_FUZZ_SECONDS:-900} STRATA_FUZZ_SEED=$${STRATA_FUZZ_SEED:-random} \
	STRATA_BAD_INPUT_EXAMPLES=$${STRATA_BAD_INPUT_EXAMPLES:-5000} \
		$(VENV)/bin/pytest -q -s tests/integration/test_mutated_requests.py tests/integration/test_bad_input.py

# The cluster's fault loop: 100 SIGKILLs of random partition leaders and 20 controlled restarts
# under an idempotent acks=all producer and a group consumer. Not in `make test` (which has the
# single-fault replication tests): about 15 minutes on this machine.
faults: venv system-deps
	STRATA_REPLICATION_ROUNDS=$${STRATA_REPLICATION_ROUNDS:-120} \
		$(VENV)/bin/pytest -q -m faults tests/integration/test_replication.py

# The transactions fault loop: STRATA_TXN_KILLS (30) SIGKILLs of the transaction coordinator and
# of output partition leaders under an exactly-once consume-transform-produce loop; ~8 minutes.
# Then transaction.version in ZooKeeper's /feature across three brokers (~20 s).
faults-txn: venv system-deps
	STRATA_TXN_KILLS=$${STRATA_TXN_KILLS:-30} \
		$(VENV)/bin/pytest -q -m faults tests/integration/test_transactions_cluster.py \
		tests/integration/test_transactions_v2_cluster.py

# The object store unreachable for STRATA_S3_OUTAGE_S (60) while producing and consuming on a
# tiered topic (`make test` has a 20 s outage); about 2 minutes.
faults-tiered: venv system-deps
	STRATA_S3_OUTAGE_S=$${STRATA_S3_OUTAGE_S:-60} \
		$(VENV)/bin/pytest -q -m faults tests/integration/test_tiered_faults.py

# The network-partition loop (issue 51): five faults (leader isolated, leader cut from ZooKeeper,
# leader split from the majority, controller isolated, leader-follower link down), each
# STRATA_NETFAULT_ROUNDS (2) times for 20-25 s on a cluster of its own, brokers and ZooKeeper in
# network namespaces (needs root), under an idempotent and a plain acks=all producer and a
# group consumer (the one-cut version runs in `make test`).
faults-net: venv system-deps
	STRATA_NETFAULT_ROUNDS=$${STRATA_NETFAULT_ROUNDS:-2} \
		$(VENV)/bin/pytest -q -m faults_net tests/integration/test_network_faults.py

bench-log: venv
	$(PY) -m benchmarks.log_bench

# One authorization decision's cost with 10,000 ACL bindings loaded (in-process).
bench-acl: venv
	$(PY) -m benchmarks.acl_decisions

# Log cleaner throughput (MB/s of dirty log compacted in-process).
bench-cleaner: venv
	$(PY) -m benchmarks.cleaner

# Broker restart time with 1M offset commits in __consumer_offsets, before and after the log
# cleaner compacts it (issue 28), 3 rounds each; results are copied into docs/benchmarks.md by hand.
bench-offsets-restart: venv
	$(PY) -m benchmarks.offsets_restart --rounds 3

# Strata vs Apache Kafka 4.x on this machine, same clients and settings, 3 alternating rounds;
# writes its section of docs/benchmarks.md and the charts under docs/benchmarks/; then the TLS
# comparison of bench-tls (3 rounds, its JSON only) and the authorizer's cost of bench-authz.
bench: venv kafka-dist
	$(PY) -m benchmarks.compare --report-md docs/benchmarks.md --charts-dir docs/benchmarks \
		--json docs/benchmarks/compare.json
	$(PY) -m benchmarks.tls --rounds 3 --warmup-mib 1024 --json docs/benchmarks/tls.json
	$(PY) -m benchmarks.authorizer --rounds 8 --mib 512 --warmup-mib 512 --json docs/benchmarks/authorizer.json

# The harnesses' tests (tests/bench/: their reports and meters, fetch_cost and rejoin at a tiny
# size), then every workload of `make bench` at a tiny size against Strata alone; run by CI
# after `make test`.
bench-smoke: venv system-deps
	$(VENV)/bin/pytest -q -m bench tests/bench
	$(PY) -m benchmarks.compare --smoke --charts-dir $${TMPDIR:-/tmp}/strata-bench-smoke

# Produce and hot consume over TLS (SSL listener) and new TLS + SCRAM-SHA-512 connections per
# second (SASL_SSL), Strata and Kafka 4.x with the same certificate and pinned cipher (issue 45);
# results are copied into docs/benchmarks.md by hand.
bench-tls: venv kafka-dist
	$(PY) -m benchmarks.tls --rounds 5 --warmup-mib 1024 --json docs/benchmarks/tls.json

# Produce and consume over SASL_PLAINTEXT as a user that is not a super user, Kafka's authorizer
# off and on with 10,000 ACL bindings loaded, Strata and Kafka 4.x, alternating rounds (issue 46);
# results are copied into docs/benchmarks.md by hand.
bench-authz: venv kafka-dist
	$(PY) -m benchmarks.authorizer --rounds 8 --mib 512 --warmup-mib 512 --json docs/benchmarks/authorizer.json

# Leader and controller failover on three brokers, Strata (ZooKeeper) and Kafka 4.x (KRaft),
# 3 rounds each; results are copied into docs/benchmarks.md by hand.
bench-failover: venv system-deps kafka-dist
	$(PY) -m benchmarks.failover --system strata --rounds 3 --json docs/benchmarks/failover-strata.json
	$(PY) -m benchmarks.failover --system kafka --rounds 3 --json docs/benchmarks/failover-kafka.json

# Creating 100 topics of 10 partitions at replication factor 3 on three brokers, Strata
# (ZooKeeper) and Kafka 4.x (KRaft), 3 rounds each, with the brokers' slowest ApiVersions answer
# meanwhile (issue 50); results are copied into docs/benchmarks.md by hand.
bench-topic-creation: venv system-deps kafka-dist
	$(PY) -m benchmarks.topic_creation --system strata --rounds 3 --json docs/benchmarks/topic-creation-strata.json
	$(PY) -m benchmarks.topic_creation --system kafka --rounds 3 --json docs/benchmarks/topic-creation-kafka.json

# Partition unavailability under network faults (issue 51): Strata and Kafka 4.x (KRaft), each
# node in a network namespace (needs root); 5 faults x 3 rounds of 25 s each, about 15 minutes.
bench-netfaults: venv system-deps kafka-dist
	$(PY) -m benchmarks.netfaults --system strata --rounds 3 --cut-s 25 --json docs/benchmarks/netfaults-strata.json
	$(PY) -m benchmarks.netfaults --system kafka --rounds 3 --cut-s 25 --json docs/benchmarks/netfaults-kafka.json

# RF 3 acks=all produce (flat out, then rate-limited for latency) and a follower's catch-up on
# three brokers, Strata and Kafka 4.x.
bench-replication: venv system-deps kafka-dist
	$(PY) -m benchmarks.replication --system kafka --rounds 3 --json docs/benchmarks/replication-kafka.json
	$(PY) -m benchmarks.replication --system strata --rounds 3 --json docs/benchmarks/replication-strata.json

# Kafka transactions on one broker (issue 29): transactions/s of 1,000-record transactions and
# read_committed (and read_uncommitted) consume throughput over committed and partly aborted
# data, Strata and Kafka 4.x, 3 rounds each; results are copied into docs/benchmarks.md by hand.
bench-transactions: venv kafka-dist
	$(PY) -m benchmarks.transactions --system kafka --rounds 3 --json docs/benchmarks/transactions-kafka.json
	$(PY) -m benchmarks.transactions --system strata --rounds 3 --json docs/benchmarks/transactions-strata.json

# A replaced follower (log dir wiped, same id) rejoining the ISR of a 1 GiB topic, tiered and not
# (KIP-405's test case 3; tiered: KIP-1023 off and on alternately), Strata and Kafka 4.x;
# results are copied into docs/benchmarks.md by hand.
bench-rejoin: venv system-deps kafka-dist
	$(PY) -m benchmarks.rejoin --system strata --tiered off --data-mib 1024 --rounds 3 --json docs/benchmarks/rejoin-strata-untiered.json
	$(PY) -m benchmarks.rejoin --system kafka --tiered off --data-mib 1024 --rounds 3 --json docs/benchmarks/rejoin-kafka-untiered.json
	$(PY) -m benchmarks.rejoin --system strata --tiered on --data-mib 1024 --rounds 3 --fetch-last-tiered-offset both --json docs/benchmarks/rejoin-strata-tiered.json
	$(PY) -m benchmarks.rejoin --system kafka --tiered on --data-mib 1024 --rounds 3 --fetch-last-tiered-offset both --json docs/benchmarks/rejoin-kafka-tiered.json

# Full-history scan of a >= 1 GiB tiered topic with Spark: the strata source in `direct` and
# `broker` mode vs Spark's Kafka connector, 3 rounds; writes its section of docs/benchmarks.md.
bench-spark: venv spark-kafka-dist
	$(PY) -m benchmarks.spark_scan --report-md docs/benchmarks.md --json docs/benchmarks/spark_scan.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
