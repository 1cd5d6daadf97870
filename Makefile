# Conveniences over scripts/ (make itself is not needed: the README uses the scripts).
BUILD_DIR ?= build
.PHONY: run test check build format format-check bench fuzz load compare llama llama-trace clean

run:
	bash scripts/run.sh
test:
	bash scripts/test.sh
# The everyday loop: build, then only the tests labelled unit (seconds; the
# labels are in docs/testing.md).
check: build
	ctest --test-dir $(BUILD_DIR) -L unit -j 2 --output-on-failure
build:
	bash -c 'source scripts/lib.sh && build'
format:
	cmake --build $(BUILD_DIR) --target format
format-check:
	cmake --build $(BUILD_DIR) --target format-check
# Every figure of docs/performance.md, with its baseline; JSON in build/bench-summary.json.
bench: build
	$(BUILD_DIR)/bin/cxltier-bench --summary=$(BUILD_DIR)/bench-summary.json

# 256 clients x 1K blocks reporting for 60 s against one cxltierd (docs/security.md).
load: build
	BUILD_DIR=$(abspath $(BUILD_DIR)) bash scripts/load.sh 256 1024 60

# cxltier against the kernel's own tiering in the QEMU guests (docs/comparison.md):
# the tuning sweep, both kernels, both workloads, three runs of the headline
# arms (hours; resumable: run it again to go on); build/compare/results.json.
compare: build
	bash tools/qemu/compare_all.sh --bin $(abspath $(BUILD_DIR))/bin --cache $(abspath $(BUILD_DIR))/qemu-cache --out $(abspath $(BUILD_DIR))/compare

# libFuzzer targets (clang), FUZZ_SECONDS each; the tests run them for 30 s.
FUZZ_SECONDS ?= 600
fuzz:
	BUILD_DIR=$(abspath $(BUILD_DIR)) bash tests/fuzz/run.sh $(FUZZ_SECONDS)

# cxltier-llama (docs/llama.md): the Debian forky root with llama.cpp (cached in
# $(BUILD_DIR)/llama/root), cxltier-llama built in it, page and copy mode against
# the host's cxltierd; build/llama/summary.json. Needs root and Debian's archive.
llama:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD_DIR) -j $${JOBS:-1} --target cxltierd cxltierctl cxltier-sim
	BUILD_DIR=$(abspath $(BUILD_DIR)) bash tools/llama/run.sh

# The same run with conversations from the Mooncake sample (docs/llama.md,
# "The trace run"): build/llama/summary-trace.json. 115 to 170 s warm.
llama-trace:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD_DIR) -j $${JOBS:-1} --target cxltierd cxltierctl cxltier-sim
	BUILD_DIR=$(abspath $(BUILD_DIR)) CXLTIER_LLAMA_TAG=-trace bash tools/llama/run.sh \
	  --trace /cxltier/src/tests/data/mooncake_synthetic_trace.jsonl

clean:
	rm -rf $(BUILD_DIR) $(BUILD_DIR)-address $(BUILD_DIR)-thread $(BUILD_DIR)-fuzz
