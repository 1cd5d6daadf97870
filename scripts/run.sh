#!/usr/bin/env bash
# The main job: install what is missing, build, and show cxltier's block plan
# for the default model at a 128K-token context.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
stage deps ensure_packages
stage build build
"$BUILD_DIR/bin/cxltierctl" plan --model llama3-70b --context 128k "$@"
