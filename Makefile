# The two commands of the quick start, and their parts.
#   make demo   installs what is missing, builds, and runs the demo (scripts/demo.sh)
#   make test   installs what is missing, builds, and runs every test
BUILD_DIR ?= build
PYTHON ?= /usr/bin/python3
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-cpp test-python bench clean fuzz sanitize

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

# Not part of `make test` (yet): libFuzzer targets (clang, own build dir) and sanitizer builds.
fuzz:
	scripts/fuzz.sh $(FUZZ_SECONDS)

sanitize:
	scripts/sanitize.sh
