# The two commands of the quick start, and their parts.
#   make demo   installs what is missing, builds, and runs the demo (scripts/demo.sh)
#   make test   installs what is missing, builds, and runs every test
BUILD_DIR ?= build
PYTHON ?= /usr/bin/python3
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-cpp test-python bench clean fuzz sanitize ci-extra ci-fuzz ci-sanitize ci-release

all: build

deps:
	scripts/install-deps.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DPython3_EXECUTABLE=$(PYTHON) $(CMAKE_FLAGS)

configure: $(BUILD_DIR)/build.ninja

build: deps configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	BUILD_DIR=$(BUILD_DIR) scripts/demo.sh

test: build
	$(MAKE) --no-print-directory test-cpp test-python

test-cpp:
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

test-python:
	@if [ -d tests/python ]; then \
	  SPDL_BUILD_DIR=$(abspath $(BUILD_DIR)) PYTHONPATH=$(abspath $(BUILD_DIR))/python \
	    $(PYTHON) -m pytest -q tests/python; \
	else echo "no Python tests yet"; fi

bench: build
	$(PYTHON) bench/run.py --build-dir $(BUILD_DIR) --out bench

clean:
	rm -rf $(BUILD_DIR)

# Not part of `make test`: libFuzzer targets (clang, own build dir) and sanitizer builds, in full.
fuzz:
	scripts/fuzz.sh $(FUZZ_SECONDS)

sanitize:
	scripts/sanitize.sh

# CI only (.ci/run runs `make test`, then this): each fuzz target for CI_FUZZ_SECONDS from its seed
# corpus (build-fuzz), a subset of the tests under ASan+UBSan (build-asan) and the concurrency
# tests under TSan (build-tsan); see scripts/sanitize.sh for the subsets and .ci/README.md for
# the time each step takes.
CI_FUZZ_SECONDS ?= 30
CI_FUZZ_TARGETS ?= control_fuzz config_fuzz resume_fuzz
ci-extra: ci-fuzz ci-sanitize ci-release

ci-fuzz:
	FUZZ_TARGETS="$(CI_FUZZ_TARGETS)" scripts/fuzz.sh $(CI_FUZZ_SECONDS)

ci-sanitize:
	SANITIZE_SUBSET=ci scripts/sanitize.sh asan tsan

# What ships (spdld, spdlctl, spdl-client, the Python module) built Release with SPDL_TEST_HOOKS=OFF
# in build-release, and checked for test seams (strings / symbols): scripts/release_check.sh.
ci-release:
	PYTHON=$(PYTHON) scripts/release_check.sh
