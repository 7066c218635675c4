#!/usr/bin/env bash
# buf lint (STANDARD rules, exceptions in buf.yaml) over the API's protos.
set -euo pipefail
export BUF_CACHE_DIR="$TEST_TMPDIR/buf-cache"
tools/npm/node_modules/.bin/buf lint
echo "buf lint: clean"
