# Conveniences over scripts/ (make itself is not needed: the README uses the scripts).
BUILD_DIR ?= build
.PHONY: run test build format format-check clean

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
clean:
	rm -rf $(BUILD_DIR)
