# DYAD: the two commands (see README.md).
#   make demo   install missing Debian packages, build, run the two-node demo
#   make test   install missing Debian packages, build, run the whole test suite
#   make fuzz   libFuzzer on every decoder, FUZZ_SECONDS (default 60) per target
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo
FUZZ_SECONDS ?= 60

MAKEFLAGS += --no-print-directory

.PHONY: all deps configure build demo test fuzz install bench bench-quick clean

all: build

deps:
	@./scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

demo: build
	@$(BUILD)/dyad demo

# The fuzz targets build with clang-16 into build-fuzz/ (tests/fuzz/run.sh);
# ctest's fuzz_smoke entry then only runs them. Exit 77: no clang-16.
test: build
	@./tests/fuzz/run.sh build || [ $$? -eq 77 ]
	@cd $(BUILD) && ctest --output-on-failure --timeout 900

fuzz: deps
	@./tests/fuzz/run.sh fuzz $(FUZZ_SECONDS)

bench: build
	@/usr/bin/python3 bench/run_bench.py --build $(BUILD)

bench-quick: build
	@/usr/bin/python3 bench/run_bench.py --build $(BUILD) --quick

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	@rm -rf $(BUILD)
