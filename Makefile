# DYAD: the commands of README.md.
#   make demo       the packages the demo needs, build dyad, dyad-service and
#                   dyad-demo only, run the two-node demo
#   make test       build + test packages, build everything, run the whole test suite
#   make bench      build + test + bench packages, build everything, run the benchmarks
#   make install    build packages only; a separate build tree ($(INSTALL_BUILD))
#                   without tests or benchmarks, installed into PREFIX
#   make uninstall  remove what the last `make install` installed (its manifest)
#   make fuzz       libFuzzer on every decoder, FUZZ_SECONDS (default 60) per target
# Packages come from scripts/install-deps.sh (installs as root, otherwise
# lists what is missing); DEPS=true skips that step.
BUILD ?= build
INSTALL_BUILD ?= $(BUILD)-install
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo
FUZZ_SECONDS ?= 60
DEPS ?= ./scripts/install-deps.sh
# What `dyad demo` runs: the dyad command, the service, and the demo program
# (the client libraries come as their dependencies).
DEMO_TARGETS = dyad dyad-service dyad-demo

MAKEFLAGS += --no-print-directory

# flux-core for the Flux parts (cmake/DyadFlux.cmake): when
# scripts/build-flux-core.sh has built its 0.73.0 prefix (in a cache outside
# the checkout; .ci/run builds it), pkg-config finds that one first;
# otherwise a system flux-core, or none (the Flux parts are left out and
# `make test` says their tests were skipped).
FLUX_ENV = fp=$$(./scripts/build-flux-core.sh --print 2>/dev/null) && \
	   export PKG_CONFIG_PATH="$$fp/lib/pkgconfig$${PKG_CONFIG_PATH:+:$$PKG_CONFIG_PATH}";
FLUX_NOTE = if grep -q '^DYAD_FLUX_BUILT:INTERNAL=ON$$' $(BUILD)/CMakeCache.txt 2>/dev/null; then \
	   echo "make test: the Flux tests run inside flux start, with $$(sed -n 's/^DYAD_FLUX_FOUND_AT:INTERNAL=//p' $(BUILD)/CMakeCache.txt)"; \
	 else \
	   echo "make test: the Flux tests were SKIPPED: $$(sed -n 's/^DYAD_FLUX_SKIP_REASON:INTERNAL=//p' $(BUILD)/CMakeCache.txt)"; \
	 fi

.PHONY: all deps configure build demo test fuzz install uninstall bench bench-quick clean

all: build

deps:
	@$(DEPS) all

# The full tree (tests and benchmarks), for `make test` and `make bench`.
configure:
	@$(FLUX_ENV) cmake -S . -B $(BUILD) $(CMAKE_FLAGS) -DDYAD_BUILD_TESTS=ON -DDYAD_BUILD_BENCH=ON >/dev/null

build:
	@$(DEPS) build test
	@$(MAKE) configure
	@cmake --build $(BUILD) -j$(JOBS)

# A fresh $(BUILD) is configured without tests and benchmarks (their
# packages are not needed); an existing one is kept as it is. Either way
# only the demo's programs are built.
demo:
	@echo "make demo: [1/4] Debian packages the demo needs ($(DEPS) demo)"
	@$(DEPS) demo
	@if [ -f $(BUILD)/CMakeCache.txt ]; then \
	   echo "make demo: [2/4] configuring $(BUILD)/ (CMake; the existing configuration)"; \
	   cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null; \
	 else \
	   echo "make demo: [2/4] configuring $(BUILD)/ (CMake; no tests, no benchmarks)"; \
	   cmake -S . -B $(BUILD) $(CMAKE_FLAGS) -DDYAD_BUILD_TESTS=OFF -DDYAD_BUILD_BENCH=OFF >/dev/null; \
	 fi
	@echo "make demo: [3/4] building $(DEMO_TARGETS) (only what the demo runs)"
	@cmake --build $(BUILD) -j$(JOBS) --target $(DEMO_TARGETS)
	@echo "make demo: [4/4] running the demo ($(BUILD)/dyad demo)"
	@$(BUILD)/dyad demo

# The fuzz targets build with clang-16 into build-fuzz/ (tests/fuzz/run.sh);
# ctest's fuzz_smoke entry then only runs them. Exit 77: no clang-16.
test:
	@echo "make test: [1/4] Debian packages (build, test)"
	@$(DEPS) build test
	@echo "make test: [2/4] configuring $(BUILD)/ (CMake, with tests and benchmarks)"
	@$(MAKE) configure
	@$(FLUX_NOTE)
	@echo "make test: [3/4] building everything"
	@cmake --build $(BUILD) -j$(JOBS)
	@./tests/fuzz/run.sh build || [ $$? -eq 77 ]
	@echo "make test: [4/4] running the test suite (ctest)"
	@cd $(BUILD) && ctest --output-on-failure --timeout 900; rc=$$?; cd $(CURDIR); \
	 $(FLUX_NOTE); exit $$rc

fuzz:
	@$(DEPS) build test
	@./tests/fuzz/run.sh fuzz $(FUZZ_SECONDS)

bench:
	@$(DEPS) build test bench
	@$(MAKE) configure
	@cmake --build $(BUILD) -j$(JOBS)
	@/usr/bin/python3 bench/run_bench.py --build $(BUILD)

bench-quick:
	@$(DEPS) build test bench
	@$(MAKE) configure
	@cmake --build $(BUILD) -j$(JOBS)
	@/usr/bin/python3 bench/run_bench.py --build $(BUILD) --quick

# Only the build packages, and a tree of its own without tests or
# benchmarks: the product, nothing else.
install:
	@echo "make install: [1/4] Debian packages to build ($(DEPS) build)"
	@$(DEPS) build
	@echo "make install: [2/4] configuring $(INSTALL_BUILD)/ (CMake; no tests, no benchmarks)"
	@$(FLUX_ENV) cmake -S . -B $(INSTALL_BUILD) $(CMAKE_FLAGS) -DCMAKE_INSTALL_PREFIX=$(PREFIX) \
	   -DDYAD_BUILD_TESTS=OFF -DDYAD_BUILD_BENCH=OFF >/dev/null
	@echo "make install: [3/4] building"
	@cmake --build $(INSTALL_BUILD) -j$(JOBS)
	@echo "make install: [4/4] installing into $(PREFIX)"
	@cmake --install $(INSTALL_BUILD) --prefix $(PREFIX)

# The manifest of the last install from $(INSTALL_BUILD), or, with PREFIX on
# the command line, the copy every install leaves in PREFIX/share/dyad.
uninstall:
	@m=$(INSTALL_BUILD)/install_manifest.txt; \
	 if [ "$(origin PREFIX)" = "command line" ] || [ ! -f "$$m" ]; then \
	   m=$(PREFIX)/share/dyad/install_manifest.txt; \
	 fi; \
	 if [ ! -f "$$m" ]; then \
	   echo "make uninstall: no install manifest ($$m); nothing was installed from here into $(PREFIX)" >&2; \
	   exit 1; \
	 fi; \
	 cmake -DMANIFEST="$$m" -P cmake/DyadUninstall.cmake

clean:
	@rm -rf $(BUILD) $(INSTALL_BUILD)
