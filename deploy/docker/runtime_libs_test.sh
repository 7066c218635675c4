#!/usr/bin/env bash
# The image's runtime stage installs exactly the packages whose libraries the binaries load.
set -euo pipefail
dir=${TEST_SRCDIR:+$TEST_SRCDIR/$TEST_WORKSPACE/deploy/docker}
dir=${dir:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
needed=$("$dir/runtime_libs.sh" "$@")
listed=$(grep -v '^#' "$dir/runtime-packages.txt" | sort -u)
if [[ "$needed" != "$listed" ]]; then
  echo "runtime_libs_test: deploy/docker/runtime-packages.txt differs from what the binaries load:" >&2
  diff <(echo "$listed") <(echo "$needed") >&2 || true
  exit 1
fi
echo "runtime stage covers the $(echo "$needed" | wc -l) packages of $# binaries"
