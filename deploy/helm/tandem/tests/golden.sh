#!/usr/bin/env bash
# Renders every case of cases.txt and compares it with tests/golden/<case>.yaml (and the NOTES),
# or with --update rewrites the golden files. Usage: deploy/helm/tandem/tests/golden.sh [--update]
set -euo pipefail
# Under Bazel this script runs as <package>/<test name>; by hand, from tests/.
lib=${TEST_SRCDIR:+$TEST_SRCDIR/$TEST_WORKSPACE/deploy/helm/tandem/tests/render_lib.sh}
source "${lib:-$(dirname "${BASH_SOURCE[0]}")/render_lib.sh}"

rendered() { :; }  # The renders are compared as a whole below.

if [[ "${1:-}" == "--update" ]]; then
  rm -rf "$tests_dir/golden" && mkdir -p "$tests_dir/golden"
  for_each_case rendered "$tests_dir/golden"
  echo "golden renders written to $tests_dir/golden"
  exit 0
fi
mkdir -p "$work/rendered"
start=$(date +%s%N)
for_each_case rendered "$work/rendered"
echo "rendered $(ls "$work/rendered" | wc -l) files in $(( ($(date +%s%N) - start) / 1000000 )) ms"
if ! diff -ru "$tests_dir/golden" "$work/rendered"; then
  echo "golden.sh: the chart renders differently; if intended, run deploy/helm/tandem/tests/golden.sh --update" >&2
  exit 1
fi
