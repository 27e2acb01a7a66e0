# The two commands of the quick start, and their parts.
#   make demo   installs what the build and the demo need (no Python test stack), builds the four
#               programs the demo runs, and runs the demo (scripts/demo.sh)
#   make test   installs what the tests need too, builds everything, and runs every test
#   make bench  installs the benchmark's plotting too, builds, runs bench/run.py
BUILD_DIR ?= build
PYTHON ?= /usr/bin/python3
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
DEMO_TARGETS = spdld spdl-client spdlctl spdl-make-dataset

.PHONY: all deps deps-demo deps-test deps-bench configure build build-demo demo test format-check format test-cpp test-python \
	bench clean fuzz sanitize lint ci-lint ci-extra ci-fuzz ci-sanitize ci-release

all: build

# scripts/install-deps.sh installs only what is missing, one set per purpose.
deps: deps-bench
deps-demo:
	scripts/install-deps.sh demo
deps-test:
	scripts/install-deps.sh test
deps-bench:
	scripts/install-deps.sh bench

# ccache (installed by `scripts/install-deps.sh test`) compiles for the build of `make test` and
# the Release build of `make ci-release` (scripts/release_check.sh), both in the user's one cache
# (ccache's default or its config's cache_dir): CI builds the test build Release too (.ci/run), so
# that most of what ships comes from the cache there. CCACHE= (empty) builds without it. The
# base_dir makes the paths in each command relative to the build directory, so that build/ and
# build-release/ (or two checkouts) share the entries of the sources they have in common.
CCACHE ?= $(shell command -v ccache 2>/dev/null)
export CCACHE_BASEDIR ?= $(CURDIR)
ccache_flags = $(if $(CCACHE),-DCMAKE_C_COMPILER_LAUNCHER=$(CCACHE) -DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE))

# Always re-run: picks up CMAKE_FLAGS and the libraries a later deps step installed (the Python
# binding is built once python3-dev, pybind11 and dlpack are there); a no-op when nothing changed.
configure:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DPython3_EXECUTABLE=$(PYTHON) $(ccache_flags) $(CMAKE_FLAGS)

build: deps-test configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

build-demo: deps-demo configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target $(DEMO_TARGETS)

demo: build-demo
	BUILD_DIR=$(BUILD_DIR) scripts/demo.sh

test: build
	$(MAKE) --no-print-directory format-check test-cpp test-python

# Every tracked C++/CUDA source formatted as .clang-format says (scripts/format.sh; `make format`
# fixes them in place).
format-check:
	scripts/format.sh

format:
	scripts/format.sh --fix

test-cpp:
	cd $(BUILD_DIR) && ctest --output-on-failure --no-tests=error -j $(JOBS)

test-python:
	@if [ -d tests/python ]; then \
	  SPDL_BUILD_DIR=$(abspath $(BUILD_DIR)) PYTHONPATH=$(abspath $(BUILD_DIR))/python \
	    $(PYTHON) -m pytest -q tests/python; \
	else echo "no Python tests yet"; fi

bench: deps-bench configure
	cmake --build $(BUILD_DIR) -j $(JOBS)
	$(PYTHON) bench/run.py --build-dir $(BUILD_DIR) --out bench

clean:
	rm -rf $(BUILD_DIR)

# clang-tidy (the pinned one scripts/install-deps.sh test installs) on the whole tree with
# .clang-tidy's checks, reading the build of `make test` (compile_commands.json and the generated
# headers); any finding fails. LINT_CACHE= (empty) lints everything again; by default clean results
# are cached per preprocessed file. `make ci-lint` (.ci/run, after `make test`, on its `build`): no
# cache (a fresh machine has none, and computing its keys would cost a preprocessing per file), on
# CI's 2 cores.
CI_LINT_JOBS ?= 2
lint: deps-test configure
	BUILD_DIR=$(BUILD_DIR) JOBS=$(JOBS) scripts/lint.sh

ci-lint: deps-test configure
	BUILD_DIR=$(BUILD_DIR) JOBS=$(CI_LINT_JOBS) LINT_CACHE= scripts/lint.sh

# Not part of `make test`: libFuzzer targets (clang, own build dir) and sanitizer builds, in full.
fuzz:
	scripts/fuzz.sh $(FUZZ_SECONDS)

sanitize:
	scripts/sanitize.sh

# CI only (.ci/run runs `make test`, then this): each fuzz target from its seed corpus for
# CI_FUZZ_SECONDS, or for its own :N seconds in CI_FUZZ_TARGETS, a subset of the tests under
# ASan+UBSan and the concurrency tests under TSan (build-tsan, gcc); see scripts/sanitize.sh for the
# subsets and .ci/README.md for the time each step takes. With CI_ASAN_BUILD=fuzz (the default) the
# fuzzing and the ASan+UBSan tests share one clang build (build-fuzz-asan,
# cmake/clang-asan-fuzz.cmake): ci-fuzz builds the instrumented libraries and the fuzz targets,
# ci-sanitize adds the test executables to the same build. CI_ASAN_BUILD=gcc: the standalone clang
# fuzz build (build-fuzz) and a separate gcc ASan+UBSan build (build-asan), as before.
CI_FUZZ_SECONDS ?= 12
CI_FUZZ_TARGETS ?= control_fuzz config_fuzz resume_fuzz tar_fuzz image_fuzz audio_fuzz video_fuzz http_fuzz
CI_ASAN_BUILD ?= fuzz
ifeq ($(CI_ASAN_BUILD),fuzz)
CI_FUZZ_ENV = FUZZ_WITH_TESTS=1 FUZZ_BUILD_DIR=build-fuzz-asan
endif
ci-extra: ci-fuzz ci-sanitize ci-release

# A fixed seed: CI replays the corpus and the same mutations each run (a gate, not a search: a
# finding there is a regression, not luck of the draw); `make fuzz` searches with fresh seeds.
CI_FUZZ_SEED ?= 1
ci-fuzz:
	$(CI_FUZZ_ENV) FUZZ_TARGETS="$(CI_FUZZ_TARGETS)" FUZZ_ARGS="-seed=$(CI_FUZZ_SEED) $(FUZZ_ARGS)" \
	  scripts/fuzz.sh $(CI_FUZZ_SECONDS)

ci-sanitize:
	SANITIZE_ASAN_BUILD=$(CI_ASAN_BUILD) SANITIZE_SUBSET=ci scripts/sanitize.sh asan tsan

# What ships (spdld, spdlctl, spdl-client, the Python module) built Release with SPDL_TEST_HOOKS=OFF
# in build-release, and checked for test seams (strings / symbols): scripts/release_check.sh.
# RELEASE_CMAKE_FLAGS: more cmake flags for that build (CI: -DSPDL_WERROR=ON, as its test build, so
# that the commands are the same and ccache has the objects the two builds share).
RELEASE_CMAKE_FLAGS ?=
ci-release:
	PYTHON=$(PYTHON) RELEASE_CMAKE_FLAGS="$(ccache_flags) $(RELEASE_CMAKE_FLAGS)" scripts/release_check.sh
