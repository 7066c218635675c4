#!/usr/bin/env bash
# Builds helm_render with Debian's Go toolchain and packaged libraries (no module download)
# into $1 (a file path). Used by the chart's tests and tools.
set -euo pipefail
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$(realpath -m "$1")
cache=${GOCACHE:-${TEST_TMPDIR:-${XDG_CACHE_HOME:-$HOME/.cache}}/go-build}
cd "$source_dir"
GOPATH=/usr/share/gocode GO111MODULE=off GOCACHE="$cache" go build -o "$out" .
