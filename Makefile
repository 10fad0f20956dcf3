# fastpoll: `make up` runs the stack on loopback, `make test` proves it. Both install what is missing.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

# Debian 12 packages the build, the stack and the tests need.
APT_PACKAGES := build-essential pkg-config libevent-dev libmemcached-dev libhiredis-dev libinih-dev libxxhash-dev \
	uthash-dev libcjson-dev nettle-dev libcmocka-dev memcached redis-server redis-tools nginx curl \
	apache2-utils wrk strace python3-venv python3-dev zlib1g-dev postgresql libpq5 redis-sentinel
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: all deps venv build up down status test test-unit test-integration bench bench-quick bench-longpoll clean

all: build

# Installs only what is missing, so a second run costs nothing. Debian's own nginx, memcached and
# redis services are never needed (the stack uses its own ports), so they are not started here.
define apt_install
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null \
		| grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "apt: installing $$missing"; \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi
endef

deps:
	$(call apt_install,$(APT_PACKAGES))

$(VENV)/.done: fallback_app/pyproject.toml pyproject.toml sdk/python/pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# pylibmc from source: it must link Debian's libmemcached, the same ketama as the poll server.
	# types-PyYAML: stubs for make test-unit's mypy over tests/ (test_monitoring imports yaml).
	# selenium: tests/test_browser.py's driver, here so that mypy sees its types; the browser
	# itself comes from make deps-browser.
	# -e .: the test and bench kit (fastpoll_testkit, loadtests), imported by name everywhere.
	# -e sdk/python: the Python SDK (fastpoll_client), tested against a real stack.
	$(PIP) install -q --no-binary pylibmc -e 'fallback_app[test]' -e . -e sdk/python jinja2 ruff matplotlib \
		types-PyYAML 'selenium>=4.20,<5'
	touch $@

venv: deps $(VENV)/.done

build: deps
	$(MAKE) -C poll_server

up: venv build
	$(PY) -m fastpoll_testkit.stack up

down:
	@if [ -x $(PY) ]; then $(PY) -m fastpoll_testkit.stack down; else echo "fastpoll: not running"; fi

# The local stack's health from its admin endpoints; HOSTS=h1,h2 checks fleet hosts over ssh.
status:
	@$(PY) -m fastpoll_testkit.status $(if $(HOSTS),--hosts $(HOSTS))

test-unit: venv build
	$(MAKE) -C poll_server test check
	$(VENV)/bin/ruff check fallback_app tests loadtests testkit poll_server/tests sdk/python sdk/node/tests  # ruff.toml
	$(VENV)/bin/mypy fallback_app/fastpoll_app testkit/fastpoll_testkit tests loadtests \
		poll_server/tests sdk/python/src/fastpoll_client sdk/python/tests sdk/node/tests  # mypy.ini
	$(VENV)/bin/pytest -q --durations=10 fallback_app/tests
	# The poll server's config table against the docs, the example, Ansible and the app (no stack).
	$(VENV)/bin/pytest -q tests/test_config_table.py

# The integration suite runs once, on the ASan+UBSan poll server: any sanitizer report in a poll
# server's log fails it (tests/conftest.py). The soak runs on the plain build: it checks that the
# resident memory stays flat, which ASan's quarantine and shadow memory would mask (docs/security.md).
test-integration: venv build deps-monitoring deps-browser
	$(MAKE) -C poll_server sanitize
	FP_POLL_SERVER=poll_server/build/poll_server-asan $(VENV)/bin/pytest -q --durations=20 -m "not soak" tests
	# The Python SDK against a real stack (its own rootdir: sdk/python/pyproject.toml).
	$(VENV)/bin/pytest -q sdk/python/tests
	$(VENV)/bin/pytest -q -m soak tests

# The Node SDK (sdk/node, @fastpoll/client): built with tsc, its node --test suite run against a
# real stack by sdk/node/tests. Debian's nodejs and npm are installed only when no npm is found.
.PHONY: sdk-node deps-node
NODE_PACKAGES := $(if $(shell command -v npm),,nodejs npm)
deps-node:
	$(call apt_install,$(NODE_PACKAGES))
sdk-node: venv build deps-node
	cd sdk/node && npm ci --no-audit --no-fund && npm run build
	$(VENV)/bin/pytest -q sdk/node/tests

# The browser client as the npm package @fastpoll/browser (client/): esbuild's minified copy in
# client/dist/, then tsc --noEmit of its types and the npm pack file list (npm test).
.PHONY: client-package
client-package: deps-node
	cd client && npm ci --no-audit --no-fund && npm run build && npm test

# tests/test_browser.py: the browser client (client/) in headless Chromium, driven by Selenium.
.PHONY: deps-browser
BROWSER_PACKAGES := chromium chromium-driver
deps-browser: venv
	$(call apt_install,$(BROWSER_PACKAGES))

# Everything CI runs (.ci/run): the stages one after another, fast checks first, and the fleet
# test alongside them from the start (its time goes mostly to waiting on ssh round trips and
# services in its containers: at load average 5-20 it took 1.4 times its time on the idle
# machine, 1,787 s against 1,263 s, docs/deploy.md); tools/stage-times prints each stage's
# time at the end, also when one fails (then the later ones do not run, the fleet test is stopped
# and the exit code is the failure's). Every package and the venv are installed first, so that
# the two never run apt or pip at the same time.
# tests/test_monitoring.py is part of test-integration's run, so make test adds only the rule checks.
TEST_STAGES := test-unit monitoring-rules test-integration sdk-node client-package bench-quick lint-c fuzz valgrind \
	check-contract-gate
TEST_ALONGSIDE := test-deploy
test: venv build deps-monitoring deps-browser deps-security deps-fleet deps-node $(VENV)/.ansible
	@tools/stage-times --alongside $(TEST_ALONGSIDE) $(MAKE) $(TEST_STAGES)

# Monitoring (docs/operations.md, "Monitoring"): promtool checks the rules and runs their unit
# tests; tests/test_monitoring.py checks the rendered prometheus.yml (promtool check config), the
# dashboard, console and rules against the metrics the running stack and Debian's exporters
# really export, and the mtail SLI program against nginx's real access log.
.PHONY: test-monitoring monitoring-rules deps-monitoring
MONITORING_PACKAGES := prometheus prometheus-node-exporter prometheus-nginx-exporter \
	prometheus-redis-exporter prometheus-postgres-exporter mtail prometheus-alertmanager
deps-monitoring: $(VENV)/.monitoring
	$(call apt_install,$(MONITORING_PACKAGES))

# tests/test_monitoring.py reads the rules and the role defaults (YAML).
$(VENV)/.monitoring: $(VENV)/.done
	$(PIP) install -q pyyaml
	touch $@

monitoring-rules: deps-monitoring
	promtool check rules monitoring/rules/fastpoll.rules.yml
	promtool test rules monitoring/rules/fastpoll.rules.test.yml

test-monitoring: venv build monitoring-rules
	$(VENV)/bin/pytest -q tests/test_monitoring.py

# The fleet test (docs/deploy.md): a real Ansible deploy to Debian 12 hosts booted here with
# systemd-nspawn in network namespaces. Needs root.
.PHONY: test-deploy deps-fleet
FLEET_PACKAGES := debootstrap systemd-container openssh-client iproute2 util-linux openssl
deps-fleet:
	$(call apt_install,$(FLEET_PACKAGES))

$(VENV)/.ansible: $(VENV)/.done
	$(PIP) install -q 'ansible-core>=2.17,<2.18' 'ansible-lint>=26,<27' 'mitogen>=0.3.54,<0.4'
	touch $@

test-deploy: venv build deps-fleet $(VENV)/.ansible
	$(SUDO) tests/fleet/run.sh $(SCENARIO)

# Security and reliability checks (docs/security.md); `make test` runs each of them, and the
# ASan+UBSan run is test-integration itself.
#   valgrind:      a subset under valgrind memcheck, for what ASan cannot see: reads of
#                  uninitialised memory and blocks still reachable at exit; any of them fails.
#   fuzz:          each libFuzzer target FUZZ_SECONDS (30) on the committed corpus.
#   lint-c:        cppcheck and clang-tidy on poll_server/src.
.PHONY: valgrind fuzz lint-c test-security deps-security
# libFuzzer's runtime is only "recommended" by clang in Debian: named, since deps skips those.
SECURITY_PACKAGES := clang libclang-rt-14-dev cppcheck clang-tidy valgrind
deps-security:
	$(call apt_install,$(SECURITY_PACKAGES))

valgrind: venv build deps-security
	$(MAKE) -C poll_server valgrind

fuzz: deps-security
	$(MAKE) -C poll_server fuzz FUZZ_SECONDS=$(or $(FUZZ_SECONDS),30)

lint-c: deps-security
	$(MAKE) -C poll_server lint

test-security: lint-c fuzz valgrind

# Full benchmark (10-15 min, capped at 18; a run cut short leaves the report as it is): loadtests/results/ and docs/benchmarks.md, on its own free ports.
bench: venv build
	$(call apt_install,linux-perf)
	$(PY) -m loadtests.bench

# CI smoke (< 1 min): every path and peer once; fails on any failed request or wrong body.
bench-quick: venv build
	$(PY) -m loadtests.bench --quick
	$(VENV)/bin/pytest -q loadtests/tests

# Long polls and conditional polls with Nchan side by side (<= 10 min, not in `make test`):
# loadtests/results/longpoll-*.json, then docs/benchmarks.md again from the latest full make bench
# run and this one. Debian's Nchan module is installed for it (its nginx only).
bench-longpoll: venv build
	$(call apt_install,libnginx-mod-nchan)
	$(PY) -m loadtests.longpoll
	$(PY) -m loadtests.report

# Rooms of 1,000 and 10,000 held members (own key + the room), one message a second for 30 s,
# and a busy room of 1,000 with 10 messages a second: fastpoll's long polls and event streams,
# Nchan's long polls and EventSource, and the proxied-stream floor (nginx unbuffered to a trivial
# streaming upstream) in 2 interleaved rounds each (loadtests/rooms.py, about 22 min on 2
# cores): loadtests/results/rooms-*.json, then
# docs/benchmarks.md's page again (its plots as they are) from the latest full make bench run and
# these. Debian's Nchan module is installed (its nginx only).
.PHONY: bench-rooms
bench-rooms: venv build
	$(call apt_install,libnginx-mod-nchan)
	$(PY) -m loadtests.rooms --members 1000 --rounds 2
	$(PY) -m loadtests.rooms --members 10000 --rounds 2
	$(PY) -m loadtests.rooms --members 1000 --rate 10 --rounds 2
	$(PY) -m loadtests.report --doc-only

# The write side (loadtests/writes.py: publishes/s and CPU per message, single and batches of 100,
# SQLite and PostgreSQL) and plain polls before and after channels (loadtests/plain_ab.py: the
# seed's ab -c 50 -n 5000 and wrk -c50 on a hit, this build against the poll server of
# PLAIN_AB_BASE built in a temporary directory, and nginx memcached_pass, in interleaved rounds),
# about 6 min; then docs/benchmarks.md's page again, as bench-rooms does.
PLAIN_AB_BASE ?= cc9fbe0
PLAIN_AB_DIR := /tmp/fastpoll-base-$(PLAIN_AB_BASE)
.PHONY: bench-writes
bench-writes: venv build
	$(PY) -m loadtests.writes --rounds 2
	rm -rf $(PLAIN_AB_DIR) && mkdir -p $(PLAIN_AB_DIR)
	git archive $(PLAIN_AB_BASE) poll_server | tar -x -C $(PLAIN_AB_DIR)
	$(MAKE) -C $(PLAIN_AB_DIR)/poll_server
	$(PY) -m loadtests.plain_ab --old $(PLAIN_AB_DIR)/poll_server/build/poll_server \
	  --old-label $(PLAIN_AB_BASE) --new poll_server/build/poll_server \
	  --new-label $$(git rev-parse --short HEAD) --rounds 3
	rm -rf $(PLAIN_AB_DIR)
	$(PY) -m loadtests.report --doc-only

clean:
	$(MAKE) -C poll_server clean
	rm -rf $(VENV)

# The contract under fire (docs/operations.md, "The contract checker"): real stacks on
# free loopback ports, clients recording every operation, a nemesis on a schedule drawn from the
# seed, then the rules of docs/api.md "The contract, as checked". A failure prints its seed.
#   check-contract SEED=N MINUTES=M [CONFIG=mc1-sqlite|mc3-pg|redis-pg]: M minutes on each
#     configuration (every one unless CONFIG); replay a failure with the SEED and CONFIG it printed.
#   check-contract-short [SEED=N]: mc1-sqlite and mc3-pg, about 3.5 minutes in all; seed from the clock.
#   check-contract-defects [SEED=N]: each tests/contract/defects/*.patch on a copy of HEAD; the
#     short run (or the longer run its `Run:` line names) must find every one (about 4 minutes each).
.PHONY: check-contract check-contract-short check-contract-defects
check-contract: venv build
	$(PY) -m fastpoll_testkit.contract $(if $(SEED),--seed $(SEED)) --minutes $(or $(MINUTES),5) \
		$(if $(CONFIG),--config $(CONFIG))

check-contract-short: venv build
	$(PY) -m fastpoll_testkit.contract --short $(if $(SEED),--seed $(SEED))

# make test's gate: the short run on a fixed seed (its schedule replays; the interleaving does
# not), so that a red CI means a regression of a known history. New seeds hunt in
# check-contract-short and check-contract; a seed that finds something joins this list.
CONTRACT_GATE_SEED := 874623
.PHONY: check-contract-gate
check-contract-gate: venv build
	$(PY) -m fastpoll_testkit.contract --short --seed $(CONTRACT_GATE_SEED)

check-contract-defects: venv build
	$(PY) -m fastpoll_testkit.contract.defects $(if $(SEED),--seed $(SEED))
