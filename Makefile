# Makefile - builds, tests, runs and installs ratelimitd.
#
# On a fresh Debian machine as root, `make run` and `make check` first
# install whatever build and test packages are missing (apt-get), generate
# and run ./configure, then build.  Objects go to build/ (build-address/,
# build-undefined/ with SANITIZER=address|undefined), so sanitizer builds
# never mix with the normal one.

.DEFAULT_GOAL := all
SHELL := /bin/bash

# Packages: what building needs, and what the tests need on top.
DEPS_BUILD = gcc make autoconf automake pkg-config libmicrohttpd-dev \
	libhiredis-dev libjansson-dev libyaml-dev libnghttp2-dev \
	libprotobuf-c-dev protobuf-c-compiler libssl-dev
DEPS_FUZZ = clang
DEPS_TEST = check libcurl4-openssl-dev redis-server nginx curl systemd \
	prometheus wrk python3 python3-yaml redis-sentinel python3-grpcio \
	nghttp2-client \
	python3-grpc-tools man-db groff-base clang-format

# The test packages come along whenever a test goal is asked for (a test
# binary too).  Only the unit tests do without libcurl.
WITH_TEST_DEPS ?= $(if $(filter check unit integration bench valgrind %/tests/%,$(MAKECMDGOALS)),1)
NEED_CURL = $(if $(filter-out unit %/tests/main_unit.o,$(MAKECMDGOALS)),yes,no)

ifneq ($(filter-out deps configure distclean clean format format-check,$(or $(MAKECMDGOALS),all)),)
-include config.mk
endif

SANITIZER ?=
BUILD := build$(if $(SANITIZER),-$(SANITIZER))

WARN = -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
	-Wformat=2 -Wwrite-strings -Wvla -Wno-format-nonliteral
ifeq ($(ENABLE_WERROR),yes)
WARN += -Werror
endif
HARDEN = -fstack-protector-strong -D_FORTIFY_SOURCE=2
OPT = -O2 -g
ifneq ($(SANITIZER),)
OPT = -O1 -g -fno-omit-frame-pointer -fsanitize=$(SANITIZER) \
	-fno-sanitize-recover=all
SAN_LDFLAGS = -fsanitize=$(SANITIZER)
endif
# ThreadSanitizer sleeps a second in every exit (atexit_sleep_ms), its time
# and not the daemon's: the shutdown tests time how soon the daemon exits.
ifeq ($(SANITIZER),thread)
export TSAN_OPTIONS ?= atexit_sleep_ms=0 second_deadlock_stack=1
endif

# src/ is grouped by layer (docs/architecture.md): base/ (logging, metrics,
# utilities) below core/ (the pure decision core and the store interface)
# below store/ (memory and Redis) and front/ (HTTP, gRPC).  Only src/ is on
# the include path, so every #include names its layer: "core/decide.h".
SRC_DIRS = src/front src/core src/store src/base
CPPFLAGS += -D_GNU_SOURCE -Isrc -I$(BUILD) \
	-I$(BUILD)/proto \
	-DRL_VERSION='"$(PACKAGE_VERSION)"'
CFLAGS ?=
CFLAGS += -std=c11 -pthread $(OPT) $(WARN) $(HARDEN)
LDFLAGS += -pthread -Wl,-z,relro,-z,now $(SAN_LDFLAGS)

LIB_CFLAGS = $(MHD_CFLAGS) $(HIREDIS_CFLAGS) $(JANSSON_CFLAGS) $(YAML_CFLAGS) \
	$(NGHTTP2_CFLAGS) $(PROTOBUFC_CFLAGS) $(OPENSSL_CFLAGS)
LIBS = $(MHD_LIBS) $(HIREDIS_LIBS) $(JANSSON_LIBS) $(YAML_LIBS) \
	$(NGHTTP2_LIBS) $(PROTOBUFC_LIBS) $(OPENSSL_LIBS) -lm

# Every source but main.c goes into librl.a, which the tests link too.
CORE_SRC = $(foreach d,$(SRC_DIRS),$(wildcard $(d)/*.c))
# The gRPC messages (proto/*.proto) are compiled by protoc-c at build time
# into $(BUILD)/proto/NAME.pb-c.[ch]; nothing generated is checked in.
PROTO = $(sort $(wildcard proto/*.proto))
PROTO_C = $(patsubst proto/%.proto,$(BUILD)/proto/%.pb-c.c,$(PROTO))
PROTO_H = $(PROTO_C:.c=.h)
PROTO_OBJ = $(PROTO_C:.c=.o)
CORE_OBJ = $(patsubst src/%.c,$(BUILD)/%.o,$(CORE_SRC)) $(BUILD)/lua_scripts.o \
	$(PROTO_OBJ)
HDRS = $(wildcard src/*/*.h) $(PROTO_H)
LUA = $(sort $(wildcard lua/*.lua))

UNIT_SRC = $(sort $(wildcard tests/unit/check_*.c))
UNIT_BIN = $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))
INTEG_SRC = $(sort $(wildcard tests/integration/check_*.c))
INTEG_BIN = $(patsubst tests/integration/%.c,$(BUILD)/tests/%,$(INTEG_SRC))
# Unit and integration binaries share $(BUILD)/tests/: one name each.
ifneq ($(filter $(notdir $(UNIT_SRC)),$(notdir $(INTEG_SRC))),)
$(error tests/unit and tests/integration both have $(filter $(notdir $(UNIT_SRC)),$(notdir $(INTEG_SRC))))
endif
INTEG_HELPERS = $(filter-out $(INTEG_SRC),$(wildcard tests/integration/*.c))
INTEG_HDRS = $(wildcard tests/integration/*.h)

.PHONY: all run check lint unit integration deps clean distclean \
	install bench format format-check

# make install [PREFIX=/usr/local] [DESTDIR=...]; the config always goes to
# $(SYSCONFDIR)/ratelimitd, where the daemon looks by default.
PREFIX ?= $(or $(prefix),/usr/local)
SYSCONFDIR ?= /etc
UNITDIR ?= $(PREFIX)/lib/systemd/system

all: $(BUILD)/ratelimitd

$(BUILD)/%.o: src/%.c $(HDRS) config.mk | $(BUILD)/tests
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LIB_CFLAGS) -c -o $@ $<

# The Lua scripts are compiled into the binary as C strings, one per file:
# lua/ratelimit.lua => const char rl_lua_ratelimit[], and its SHA1 as Redis
# computes it (the text as compiled: every line ends in a newline) in
# rl_lua_ratelimit_sha[], for EVALSHA before any SCRIPT LOAD answered.
# Comment-only and blank lines, and the indentation of the others, are
# left out of the compiled text: Redis refuses an argument over 16 KiB from
# a client not yet authenticated ("unauthenticated bulk length"), and a
# SCRIPT LOAD under that size still gets the clear NOAUTH when the password
# is missing.  (The scripts hold no multi-line string.)
LUA_STRIP = sed -e '/^[[:space:]]*--/d' -e '/^[[:space:]]*$$/d' \
	-e 's/^[[:space:]]*//'
$(BUILD)/lua_scripts.c: $(LUA) Makefile | $(BUILD)/tests
	@{ echo '/* Generated from the scripts in lua/ by the Makefile. */'; \
	for f in $(LUA); do \
		n=$$(basename $$f .lua | tr -c 'A-Za-z0-9_\n' _); \
		echo "extern const char rl_lua_$$n[], rl_lua_$${n}_sha[];"; \
		echo "const char rl_lua_$${n}_sha[] = \"$$($(LUA_STRIP) $$f | \
			awk 1 | sha1sum | cut -c1-40)\";"; \
		echo "const char rl_lua_$$n[] ="; \
		$(LUA_STRIP) $$f | awk 1 | sed -e 's/\\/\\\\/g' \
			-e 's/"/\\"/g' -e 's/^/\t"/' -e 's/$$/\\n"/'; \
		echo ';'; \
	done; } > $@

$(BUILD)/lua_scripts.o: $(BUILD)/lua_scripts.c
	$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-missing-prototypes -c -o $@ $<

$(BUILD)/proto/%.pb-c.c $(BUILD)/proto/%.pb-c.h: proto/%.proto config.mk
	@mkdir -p $(BUILD)/proto
	$(PROTOC_C) --proto_path=proto --c_out=$(BUILD)/proto $<

$(BUILD)/proto/%.pb-c.o: $(BUILD)/proto/%.pb-c.c $(PROTO_H)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(PROTOBUFC_CFLAGS) -c -o $@ $<

.SECONDARY: $(PROTO_C) $(PROTO_H)

$(BUILD)/librl.a: $(CORE_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/ratelimitd: $(BUILD)/main.o $(BUILD)/librl.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(BUILD)/tests:
	mkdir -p $@

# Every test binary links the one main() of tests/check_main.c (which also
# holds the shared fixture helpers); a test file defines test_suite().  The
# integration binaries get it compiled with CHECK_MAIN_HARNESS: h_init()
# first, and fork mode whatever CK_FORK says (tests/check_main.h).
TEST_MAIN_DEPS = tests/check_main.c tests/check_main.h config.mk

$(BUILD)/tests/main_unit.o: $(TEST_MAIN_DEPS) | $(BUILD)/tests
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) $(CHECK_CFLAGS) -c -o $@ $<

$(BUILD)/tests/main_integration.o: $(TEST_MAIN_DEPS) $(INTEG_HDRS) \
		| $(BUILD)/tests
	$(CC) $(CPPFLAGS) -Itests -Itests/integration -DCHECK_MAIN_HARNESS \
		$(CFLAGS) $(LIB_CFLAGS) $(CHECK_CFLAGS) $(CURL_CFLAGS) \
		-c -o $@ $<

$(BUILD)/tests/check_%: tests/unit/check_%.c tests/check_main.h \
		$(BUILD)/tests/main_unit.o $(BUILD)/librl.a
	$(CC) $(CPPFLAGS) -Itests $(CFLAGS) $(LIB_CFLAGS) $(CHECK_CFLAGS) \
		$(LDFLAGS) -o $@ $< $(BUILD)/tests/main_unit.o \
		$(BUILD)/librl.a $(CHECK_LIBS) $(LIBS)

$(INTEG_BIN): $(BUILD)/tests/check_%: tests/integration/check_%.c \
		$(INTEG_HELPERS) $(INTEG_HDRS) tests/check_main.h \
		$(BUILD)/tests/main_integration.o $(BUILD)/librl.a
	$(CC) $(CPPFLAGS) -Itests -Itests/integration $(CFLAGS) $(LIB_CFLAGS) \
		$(CHECK_CFLAGS) $(CURL_CFLAGS) $(LDFLAGS) -o $@ $< \
		$(INTEG_HELPERS) $(BUILD)/tests/main_integration.o \
		$(BUILD)/librl.a $(CHECK_LIBS) $(CURL_LIBS) $(LIBS)

# --- set-up -----------------------------------------------------------

# Install missing Debian packages when we can (root with apt-get).
deps:
	@missing=""; for p in $(DEPS_BUILD) $(if $(filter 1,$(WITH_TEST_DEPS)),$(DEPS_TEST)) $(if $(filter fuzz,$(MAKECMDGOALS)),$(DEPS_FUZZ)) $(if $(filter valgrind,$(MAKECMDGOALS)),valgrind); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | \
		grep -q '^install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "installing:$$missing"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends $$missing \
			>/dev/null || exit 1; \
		else \
			echo "missing packages:$$missing (run as root, or install them)"; \
		fi; \
	fi

configure: configure.ac
	@$(MAKE) --no-print-directory deps WITH_TEST_DEPS=$(WITH_TEST_DEPS)
	autoreconf -fi

# A test goal needs Check and libcurl.  A config.mk written without them
# (`make run`, then `make check`: deps installs them only now) is written
# again; a configure that still finds none stops here, not at link errors.
ifeq ($(WITH_TEST_DEPS),1)
ifneq ($(wildcard config.mk),)
ifneq ($(HAVE_CHECK)$(if $(filter yes,$(NEED_CURL)),$(HAVE_CURL),yes),yesyes)
config.mk: reconfigure-for-tests
endif
endif
endif

.PHONY: reconfigure-for-tests
reconfigure-for-tests:

config.mk: configure config.mk.in
	@$(MAKE) --no-print-directory deps WITH_TEST_DEPS=$(WITH_TEST_DEPS)
	./configure --quiet
	@if [ "$(WITH_TEST_DEPS)" = 1 ] && \
	    { ! grep -q '^HAVE_CHECK = yes' config.mk || \
	    { [ "$(NEED_CURL)" = yes ] && \
	    ! grep -q '^HAVE_CURL = yes' config.mk; }; }; then \
		echo "the tests need Check and libcurl, which pkg-config" \
		    "does not find (Debian: check libcurl4-openssl-dev)"; \
		exit 1; fi

# --- targets ------------------------------------------------------------

run: deps $(BUILD)/ratelimitd
	exec $(BUILD)/ratelimitd -c conf/ratelimitd.yaml

check: deps
	@$(MAKE) --no-print-directory lint unit integration

# make lint: the checks that read the source and run nothing: no #include
# goes up a floor of src/ (tests/lint/layers.sh, docs/architecture.md), and
# every C file is formatted as .clang-format says (format-check).
lint:
	@bash tests/lint/layers.sh
	@$(MAKE) --no-print-directory format-check

# make format: rewrite the C sources of src/ and tests/ in the house style
# (.clang-format, written for clang-format 14).  make format-check: change
# nothing; list every file that is not formatted, with the diff, and fail.
# Generated files (build/, the proto outputs), the vectors' data and the fuzz
# corpora are not C sources here and are left alone.
CLANG_FORMAT ?= clang-format
FORMAT_SRC = $(sort $(wildcard src/*.[ch] src/*/*.[ch] tests/*.[ch] tests/*/*.[ch]))
FORMAT_TOOL = command -v $(CLANG_FORMAT) >/dev/null || { echo "$(CLANG_FORMAT): not installed (make deps WITH_TEST_DEPS=1, or apt-get install clang-format)"; exit 1; }; \
	v=$$($(CLANG_FORMAT) --version | sed -n 's/.*version \([0-9]*\).*/\1/p'); \
	[ "$$v" = 14 ] || echo "warning: $(CLANG_FORMAT) is version $$v; .clang-format is written for 14, whose output may differ" >&2

format:
	@$(FORMAT_TOOL)
	@$(CLANG_FORMAT) -i --style=file $(FORMAT_SRC)

format-check:
	@$(FORMAT_TOOL)
	@set -o pipefail; bad=""; for f in $(FORMAT_SRC); do \
		if ! d=$$($(CLANG_FORMAT) --style=file "$$f" | diff -u \
		    --label "$$f" --label "$$f (clang-format)" "$$f" -); then \
			echo "not formatted: $$f"; printf '%s\n' "$$d"; \
			bad="$$bad $$f"; fi; \
	done; \
	if [ -n "$$bad" ]; then echo "not formatted:$$bad (make format)"; \
		exit 1; fi

unit: $(UNIT_BIN)
	@set -e; for t in $(UNIT_BIN); do \
		echo "== $$t"; CK_DEFAULT_TIMEOUT=60 $$t; done

# Check binaries against the real daemon, then the shell checks of the
# platform files (tests/platform/*.sh), which need no daemon build flags.
PLATFORM_TESTS = $(sort $(wildcard tests/platform/*.sh))

integration: $(BUILD)/ratelimitd $(INTEG_BIN)
	@set -e; for t in $(INTEG_BIN); do \
		echo "== $$t"; RATELIMITD_BIN=$(abspath $(BUILD)/ratelimitd) \
		RATELIMITD_SRCDIR=$(CURDIR) CK_DEFAULT_TIMEOUT=120 $$t; done
	@set -e; for t in $(PLATFORM_TESTS); do \
		echo "== $$t"; RATELIMITD_BIN=$(abspath $(BUILD)/ratelimitd) \
		RATELIMITD_SRCDIR=$(CURDIR) bash $$t; done

# make valgrind: integration tests whose timing a daemon under valgrind
# memcheck still meets, with the daemon run by tests/valgrind.sh: a memory
# error or a definite leak makes it exit 99, which fails the test's stop.
VALGRIND_TESTS ?= check_http check_auth_ip check_concurrency \
	check_vectors_redis check_limits

valgrind: deps $(BUILD)/ratelimitd $(INTEG_BIN)
	@command -v valgrind >/dev/null || { echo "valgrind: not installed (apt-get install valgrind)"; exit 1; }
	@set -e; logs=$$(mktemp -d); for t in $(VALGRIND_TESTS); do \
		echo "== $$t under valgrind"; \
		RATELIMITD_REAL_BIN=$(abspath $(BUILD)/ratelimitd) \
		VALGRIND_LOGS=$$logs RATELIMITD_SRCDIR=$(CURDIR) \
		RATELIMITD_BIN=$(CURDIR)/tests/valgrind.sh \
		CK_DEFAULT_TIMEOUT=600 $(BUILD)/tests/$$t; done; \
	rm -rf $$logs

.PHONY: valgrind

install: $(BUILD)/ratelimitd
	install -d $(DESTDIR)$(PREFIX)/sbin $(DESTDIR)$(SYSCONFDIR)/ratelimitd \
		$(DESTDIR)$(UNITDIR) $(DESTDIR)$(PREFIX)/share/man/man8
	install -m 0755 $(BUILD)/ratelimitd $(DESTDIR)$(PREFIX)/sbin/ratelimitd
	test -e $(DESTDIR)$(SYSCONFDIR)/ratelimitd/ratelimitd.yaml || \
		install -m 0644 conf/ratelimitd.yaml \
		$(DESTDIR)$(SYSCONFDIR)/ratelimitd/ratelimitd.yaml
	sed -e 's|/usr/local/sbin/|$(PREFIX)/sbin/|g' \
		-e 's|/etc/ratelimitd/|$(SYSCONFDIR)/ratelimitd/|g' \
		systemd/ratelimitd.service > $(DESTDIR)$(UNITDIR)/ratelimitd.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/ratelimitd.service
	install -m 0644 docs/man/ratelimitd.8 \
		$(DESTDIR)$(PREFIX)/share/man/man8/ratelimitd.8

clean:
	rm -rf build build-* build-fuzz

distclean: clean
	rm -rf config.mk config.log config.status configure aclocal.m4 \
		autom4te.cache

# --- fuzz: libFuzzer on the parsers of untrusted input ----------------------

# make fuzz: every tests/fuzz/fuzz_*.c target, built with clang
# (-fsanitize=fuzzer,address,undefined) against the daemon's sources built
# the same way into build-fuzz/, runs FUZZ_SECONDS each on a copy of its
# committed seed corpus (tests/fuzz/corpus/NAME); a crash stops it with the
# input saved under build-fuzz/.  FUZZ_SECONDS=600 for a long run.
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 20
FUZZ_FLAGS = -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
	-fno-sanitize-recover=all
FUZZ_SRC = $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN = $(patsubst tests/fuzz/%.c,build-fuzz/%,$(FUZZ_SRC))
# No libmicrohttpd: of the front ends, the pure RLS mapping, the access
# log line both fronts write, and the gRPC server (nghttp2), whose
# grpc_fuzz_feed() drives one connection from a buffer
# (tests/fuzz/fuzz_grpc_frames.c).
FUZZ_LIB_SRC = $(filter-out src/front/%,$(CORE_SRC)) src/front/rls.c \
	src/front/access_log.c $(wildcard src/front/grpc*.c)
FUZZ_LIB_OBJ = $(patsubst src/%.c,build-fuzz/obj/%.o,$(FUZZ_LIB_SRC)) \
	build-fuzz/obj/lua_scripts.o \
	$(patsubst $(BUILD)/proto/%.c,build-fuzz/obj/proto/%.o,$(PROTO_C))

build-fuzz/obj/%.o: src/%.c $(HDRS) config.mk
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CPPFLAGS) -std=c11 -pthread $(FUZZ_FLAGS) \
		-fsanitize=fuzzer-no-link $(LIB_CFLAGS) -c -o $@ $<

build-fuzz/obj/lua_scripts.o: $(BUILD)/lua_scripts.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CPPFLAGS) -std=c11 $(FUZZ_FLAGS) -c -o $@ $<

build-fuzz/obj/proto/%.o: $(BUILD)/proto/%.c $(PROTO_H)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(CPPFLAGS) -std=c11 $(FUZZ_FLAGS) $(PROTOBUFC_CFLAGS) \
		-c -o $@ $<

build-fuzz/%: tests/fuzz/%.c $(FUZZ_LIB_OBJ)
	$(FUZZ_CC) $(CPPFLAGS) -std=c11 -pthread $(FUZZ_FLAGS) \
		-fsanitize=fuzzer $(LIB_CFLAGS) -o $@ $< $(FUZZ_LIB_OBJ) $(LIBS)

fuzz: deps $(FUZZ_BIN)
	@set -e; for f in $(FUZZ_BIN); do \
		n=$$(basename $$f); c=build-fuzz/corpus/$$n; \
		mkdir -p $$c; cp -n tests/fuzz/corpus/$$n/* $$c/ 2>/dev/null \
			|| true; \
		echo "== $$n ($(FUZZ_SECONDS) s)"; \
		$$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			-artifact_prefix=build-fuzz/$$n- $$c 2>&1 | \
			grep -E '^(#[0-9]+.*DONE|Done|stat::number_of_executed|==[0-9]+==ERROR|SUMMARY)' ; \
		test $${PIPESTATUS[0]} -eq 0; done

.PHONY: fuzz
.SECONDARY: $(FUZZ_LIB_OBJ)

# --- bench: speed, accuracy and memory --------------------------------------

# make accuracy: bench/accuracy.c replays synthetic traces through the C
# limiter and an exact sliding log (pure, a few seconds).  make bench: that,
# then bench/memory.sh, which starts its own redis-server and prints MEMORY
# USAGE of each algorithm's key at full use (docs/algorithms.md "Measured"
# holds the results), then bench/speed.sh: the daemon under wrk beside
# redis-benchmark and nginx, in one run, ratios printed and written to
# bench/results/ (BENCH_SECONDS per run, default 10).
.PHONY: accuracy

accuracy: $(BUILD)/bench/accuracy
	$(BUILD)/bench/accuracy

$(BUILD)/bench/accuracy: bench/accuracy.c $(BUILD)/librl.a
	mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(LIB_CFLAGS) $(LDFLAGS) -o $@ $^ $(LIBS)

BENCH_SECONDS ?= 10

bench: accuracy $(BUILD)/ratelimitd
	bash bench/memory.sh
	bash bench/stats_memory.sh
	bash bench/stats_cost.sh
	bash bench/script_cost.sh
	DURATION=$(BENCH_SECONDS) RATELIMITD=$(BUILD)/ratelimitd bash bench/speed.sh
