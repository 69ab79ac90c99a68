# tessera: the two commands that matter are `make train` and `make test`.
# On a fresh Debian 12 machine with only git and make, both install what they need
# (apt-get), configure, build and run. Nothing here relies on anything installed by hand.
#
#   make deps         install missing Debian packages (no apt calls when all are present)
#   make configure-all configure the three trees `make test` builds (build/, build-asan/, build-fuzz/)
#   make build        configure (Release, Ninja) and build into build/ (binaries in build/bin/)
#   make test         build, run every test (C++ with ctest, Python with pytest); then ASan+UBSan build
#                     (build-asan/) of the tests, small sizes;
#                     then the libFuzzer targets (build-fuzz/, clang), each a few seconds over its seeds
#   make train        build and run the default training job (configs/fortunes.toml)
#   make bench        build and run build/bin/bench_ops; output kept in bench/results/
#   make format       clang-format -i every C++ file git knows of (tracked or new, not ignored)
#   make format-check list C++ files that clang-format would change (fails if any)
#   make test-fuzz    only the fuzz part of `make test` (docs/fuzzing.md runs the targets longer)
#   make clean        remove build/, build-asan/ and build-fuzz/

SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
.DEFAULT_GOAL := build

BUILD_DIR ?= build
ASAN_DIR ?= build-asan
FUZZ_DIR ?= build-fuzz
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=

# ccache: one cache per user, shared by every checkout (CCACHE_BASEDIR makes hits
# independent of where the checkout lives). CMakeLists.txt sets the launcher.
export CCACHE_DIR ?= $(HOME)/.cache/ccache
export CCACHE_BASEDIR ?= $(CURDIR)
#   Three trees (Release with the Python package's position-independent objects, ASan, fuzz)
#   outgrow ccache's default 5 GB: evictions made a CI run recompile most of them.
export CCACHE_MAXSIZE ?= 12G

# What `make deps` installs on a bare Debian 12 (apt-get --no-install-recommends), and why.
# Derived from what CMakeLists.txt finds and what the tests and `make train` run;
# tools/fresh-machine.sh proves the list on a clean debootstrap root.
DEB_BUILD := build-essential cmake ninja-build ccache pkg-config
#   The Python package (python/, cmake/python.cmake): the interpreter's headers, and venv for the
#   cached venv the build fetches nanobind (pinned) and the Python tests' packages into from PyPI.
DEB_PYTHON := python3-dev python3-venv
#   libdnnl-dev's CMake config calls find_package(OpenCL): ocl-icd-opencl-dev (a mere
#   "recommends" of libdnnl-dev) provides libOpenCL.so and the CL headers it looks for.
DEB_LIBS := libopenblas-dev libdnnl-dev ocl-icd-opencl-dev libfmt-dev libcli11-dev nlohmann-json3-dev \
  libtomlplusplus-dev libxxhash-dev libicu-dev libsentencepiece-dev libopenmpi-dev openmpi-bin
#   GoogleTest; python3 for the CLI test scripts; chromium renders the goodput HTML report in its test.
#   The fuzz tree: clang (libFuzzer is clang's), libclang-rt-14-dev (libclang_rt.fuzzer, asan,
#   ubsan: only a "recommends" of clang-14) and libomp-14-dev (clang's OpenMP: the CPU kernels
#   link OpenMP for oneDNN, and find_package(OpenMP) fails without it; also a "recommends").
#   iproute2: `ip netns`, the test hosts of the multi-host tests (tools/testbed.sh); slurm-wlm and
#   munge: the Slurm cluster those tests run on those hosts (`tools/testbed.sh slurm up`).
DEB_TEST := libgtest-dev python3 chromium clang libclang-rt-14-dev libomp-14-dev iproute2 slurm-wlm munge
#   The text `make train` learns from (/usr/share/games/fortunes).
DEB_TRAIN := fortunes
DEB_PACKAGES := $(DEB_BUILD) $(DEB_PYTHON) $(DEB_LIBS) $(DEB_TEST) $(DEB_TRAIN)
#   Only for `make format` / `make format-check`.
DEB_DEV_PACKAGES := clang-format

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps deps-dev build configure configure-asan configure-fuzz configure-all test test-release test-python test-asan \
  test-fuzz train bench \
  format format-check clean

# Installs what is missing (no apt call at all when everything is installed). A package
# counts as present only when dpkg says "installed" (not merely known, or half-removed).
define install_missing
	@missing=""; \
	for p in $(1); do \
	  [ "$$(dpkg-query -W -f='$${db:Status-Status}' "$$p" 2>/dev/null)" = installed ] || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ -n "$(SUDO)" ] && ! command -v sudo >/dev/null; then \
	    echo "make deps: missing Debian packages:$$missing"; \
	    echo "make deps: installing them needs root, and sudo is not installed."; \
	    echo "  As root, run:  apt-get update && apt-get install --no-install-recommends$$missing"; \
	    echo "  (or install sudo and give this user the right to use it), then run make again."; \
	    exit 1; \
	  fi; \
	  echo "make deps: installing$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi
endef

deps:
	$(call install_missing,$(DEB_PACKAGES))

deps-dev: deps
	$(call install_missing,$(DEB_DEV_PACKAGES))

configure: deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

# The sanitizer tree is the CPU-only build (TESSERA_ENABLE_CUDA=OFF; the Release tree
# compiles the CUDA backend where nvcc exists). Where the Release tree has CUDA, it also
# builds the benchmarks, so a CPU-only build of them is compiled by every `make test`,
# warnings as errors (without nvcc the Release tree's are that build).
ASAN_CMAKE_ARGS := -DTESSERA_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_BUILD_BENCH=ON \
  -DTESSERA_ENABLE_CUDA=OFF -DTESSERA_PYTHON=OFF
configure-asan: deps
	cmake -S . -B $(ASAN_DIR) -G Ninja $(ASAN_CMAKE_ARGS) $(CMAKE_ARGS)

# The fuzz tree (docs/fuzzing.md): clang with libFuzzer, ASan and UBSan, CPU-only, no MPI;
# only the fuzz targets and their ctests (TESSERA_BUILD_TESTS here adds no GoogleTest
# binaries to its build, `tessera_fuzz_targets` being all it builds).
FUZZ_CMAKE_ARGS := -DTESSERA_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_ENABLE_CUDA=OFF \
  -DTESSERA_ENABLE_MPI=OFF -DTESSERA_BUILD_BENCH=OFF -DTESSERA_PYTHON=OFF
configure-fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_DIR) -G Ninja $(FUZZ_CMAKE_ARGS) $(CMAKE_ARGS)

# The trees `make test` uses (tools/fresh-machine.sh configure runs this on a clean root).
configure-all: configure configure-asan configure-fuzz

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Every part always runs and prints its ctest summary; the target fails if any failed.
test: build
	@rc=0; \
	$(MAKE) --no-print-directory test-release || rc=1; \
	$(MAKE) --no-print-directory test-asan || rc=1; \
	$(MAKE) --no-print-directory test-fuzz || rc=1; \
	if [ $$rc -ne 0 ]; then echo "make test: FAILED (see the summaries above)"; else echo "make test: all passed"; fi; \
	exit $$rc

# The Python tests (label python) run after the C++ ones, through pytest itself so that
# its summary line prints; the tree must have the Python package (TESSERA_PYTHON, on by
# default when python3-dev is installed, which `make deps` does).
test-release: build
	@echo "=== tests: Release, full size ($(BUILD_DIR)/)"
	@rc=0; \
	ctest --test-dir $(BUILD_DIR) --output-on-failure --no-tests=error -j2 -LE '^python$$' || rc=1; \
	$(MAKE) --no-print-directory test-python || rc=1; \
	exit $$rc

test-python: build
	@echo "=== tests: Python (pytest, $(BUILD_DIR)/python)"
	@if [ ! -x $(BUILD_DIR)/python/run-pytest ]; then \
	  echo "test-python: $(BUILD_DIR)/ has no Python package (see cmake's 'Python package off' line)"; exit 1; \
	fi; \
	$(BUILD_DIR)/python/run-pytest

# Sanitizer half: the test binaries and the benchmarks (built, not run; skipped when the
# Release tree has compiled them CPU-only already, as on a machine without nvcc), tests
# shrunk with TESSERA_TEST_SIZE=small.
test-asan: deps
	@echo "=== tests: ASan+UBSan, small sizes ($(ASAN_DIR)/)"
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory configure-asan; \
	benches=tessera_benches; \
	if [ -f $(BUILD_DIR)/benches-cpu-only.txt ]; then \
	  benches=; echo "=== benchmarks: $(BUILD_DIR)/ compiled them CPU-only; not again here"; \
	fi; \
	cmake --build $(ASAN_DIR) -j $(JOBS) --target tessera_tests $$benches; \
	rc=0; \
	TESSERA_TEST_SIZE=small \
	ASAN_OPTIONS=abort_on_error=0:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_DIR) --output-on-failure --no-tests=error -j2 || rc=$$?; \
	echo "=== sanitizer half took $$(( $$(date +%s) - start )) s (configure + build + tests)"; \
	exit $$rc

# Fuzz part: every libFuzzer target runs TESSERA_FUZZ_SECONDS (8) over its committed seeds
# (fuzz/corpus/<target>/); a crash, sanitizer report, leak, >2 GB or >10 s input fails it.
test-fuzz: deps
	@echo "=== fuzz targets: libFuzzer + ASan+UBSan, a few seconds each ($(FUZZ_DIR)/)"
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory configure-fuzz; \
	cmake --build $(FUZZ_DIR) -j $(JOBS) --target tessera_fuzz_targets; \
	rc=0; \
	ctest --test-dir $(FUZZ_DIR) -L fuzz --output-on-failure --no-tests=error -j2 || rc=$$?; \
	echo "=== fuzz part took $$(( $$(date +%s) - start )) s (configure + build + fuzzing)"; \
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

format: deps-dev
	$(CXX_FILES) | sort -zu | xargs -0 -r clang-format -i

format-check: deps-dev
	@bad=""; \
	while IFS= read -r -d '' f; do \
	  clang-format "$$f" | cmp -s - "$$f" || bad="$$bad $$f"; \
	done < <($(CXX_FILES) | sort -zu); \
	if [ -n "$$bad" ]; then \
	  echo "not clang-formatted (run make format):"; for f in $$bad; do echo "  $$f"; done; exit 1; \
	fi; \
	echo "format-check: all C++ files are formatted"

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) $(FUZZ_DIR)
