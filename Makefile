# DYAD: the two commands (see README.md).
#   make demo   install missing Debian packages, build, run the two-node demo
#   make test   install missing Debian packages, build, run the whole test suite
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

MAKEFLAGS += --no-print-directory

.PHONY: all deps configure build demo test install bench bench-quick clean

all: build

deps:
	@./scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

demo: build
	@$(BUILD)/dyad demo

test: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 900

bench: build
	@/usr/bin/python3 bench/run_bench.py --build $(BUILD)

bench-quick: build
	@/usr/bin/python3 bench/run_bench.py --build $(BUILD) --quick

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	@rm -rf $(BUILD)
