# tessera: the two commands that matter are `make train` and `make test`.
# On a fresh Debian 12 machine with only git and make, both install what they need
# (apt-get), configure, build and run. Nothing here relies on anything installed by hand.
#
#   make deps         install missing Debian packages (no apt calls when all are present)
#   make build        configure (Release, Ninja) and build into build/ (binaries in build/bin/)
#   make test         build, run every test; then ASan+UBSan build (build-asan/) of the tests, small sizes
#   make train        build and run the default training job (configs/fortunes.toml)
#   make bench        build and run build/bin/bench_ops; output kept in bench/results/
#   make format       clang-format -i every C++ file git knows of (tracked or new, not ignored)
#   make format-check list C++ files that clang-format would change (fails if any)
#   make clean        remove build/ and build-asan/

SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
.DEFAULT_GOAL := build

BUILD_DIR ?= build
ASAN_DIR ?= build-asan
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=

# ccache: one cache per user, shared by every checkout (CCACHE_BASEDIR makes hits
# independent of where the checkout lives). CMakeLists.txt sets the launcher.
export CCACHE_DIR ?= $(HOME)/.cache/ccache
export CCACHE_BASEDIR ?= $(CURDIR)

DEB_PACKAGES := build-essential g++ cmake ninja-build ccache pkg-config \
  libopenblas-dev libdnnl-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev \
  libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libxxhash-dev clang-format fortunes chromium \
  libopenmpi-dev openmpi-bin libicu-dev libsentencepiece-dev

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps build configure test test-release test-asan train bench format format-check clean

deps:
	@missing=""; \
	for p in $(DEB_PACKAGES); do dpkg -s "$$p" >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

configure: deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Both halves always run and print their ctest summary; the target fails if either failed.
test: build
	@rc=0; \
	$(MAKE) --no-print-directory test-release || rc=1; \
	$(MAKE) --no-print-directory test-asan || rc=1; \
	if [ $$rc -ne 0 ]; then echo "make test: FAILED (see the summaries above)"; else echo "make test: all passed"; fi; \
	exit $$rc

test-release: build
	@echo "=== tests: Release, full size ($(BUILD_DIR)/)"
	ctest --test-dir $(BUILD_DIR) --output-on-failure --no-tests=error -j2

# Sanitizer half: only the test binaries, shrunk with TESSERA_TEST_SIZE=small. It is the
# CPU-only build (TESSERA_ENABLE_CUDA=OFF): the Release half compiles the CUDA backend.
test-asan: deps
	@echo "=== tests: ASan+UBSan, small sizes ($(ASAN_DIR)/)"
	@start=$$(date +%s); \
	cmake -S . -B $(ASAN_DIR) -G Ninja -DTESSERA_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DTESSERA_BUILD_BENCH=OFF -DTESSERA_ENABLE_CUDA=OFF $(CMAKE_ARGS); \
	cmake --build $(ASAN_DIR) -j $(JOBS) --target tessera_tests; \
	rc=0; \
	TESSERA_TEST_SIZE=small \
	ASAN_OPTIONS=abort_on_error=0:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_DIR) --output-on-failure --no-tests=error -j2 || rc=$$?; \
	echo "=== sanitizer half took $$(( $$(date +%s) - start )) s (configure + build + tests)"; \
	exit $$rc

# The embedded default job: prepares byte-level data from Debian's fortunes (installed by
# `make deps`), trains a small GPT for about 9 minutes on 2 cores, prints samples and
# the run summary. A second `make train` resumes from runs/fortunes (and, once it has
# finished all its steps, only reports). TRAIN_ARGS adds options, e.g.
#   make train TRAIN_ARGS="--set run.dir=runs/again"
TRAIN_ARGS ?=
train: build
	$(BUILD_DIR)/bin/tessera train --config configs/fortunes.toml --samples 3 $(TRAIN_ARGS)

bench: build
	@mkdir -p bench/results
	@out=bench/results/bench_ops-$$(date +%Y%m%d-%H%M%S)-$$(hostname -s).txt; \
	echo "writing $$out"; \
	$(BUILD_DIR)/bin/bench_ops 2>&1 | tee "$$out"

# Tracked and new (not ignored) C++ files that exist in the working tree.
CXX_FILES = git ls-files -z --cached --others --exclude-standard -- '*.cpp' '*.cc' '*.h' '*.hpp' '*.cu' '*.cuh' \
  | while IFS= read -r -d '' f; do [ -f "$$f" ] && printf '%s\0' "$$f"; done

format: deps
	$(CXX_FILES) | sort -zu | xargs -0 -r clang-format -i

format-check: deps
	@bad=""; \
	while IFS= read -r -d '' f; do \
	  clang-format "$$f" | cmp -s - "$$f" || bad="$$bad $$f"; \
	done < <($(CXX_FILES) | sort -zu); \
	if [ -n "$$bad" ]; then \
	  echo "not clang-formatted (run make format):"; for f in $$bad; do echo "  $$f"; done; exit 1; \
	fi; \
	echo "format-check: all C++ files are formatted"

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR)
