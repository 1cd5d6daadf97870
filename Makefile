# Conveniences over scripts/ (make itself is not needed: the README uses the scripts).
BUILD_DIR ?= build
.PHONY: run test build format format-check bench clean

run:
	bash scripts/run.sh
test:
	bash scripts/test.sh
build:
	bash -c 'source scripts/lib.sh && build'
format:
	cmake --build $(BUILD_DIR) --target format
format-check:
	cmake --build $(BUILD_DIR) --target format-check
# Every figure of docs/performance.md, with its baseline; JSON in build/bench-summary.json.
bench: build
	$(BUILD_DIR)/bin/cxltier-bench --summary=$(BUILD_DIR)/bench-summary.json

clean:
	rm -rf $(BUILD_DIR)
