#!/usr/bin/env bash
# Renders every case of cases.txt and compares it with tests/golden/<case>.yaml (and the NOTES),
# or with --update rewrites the golden files. Usage: deploy/helm/tandem/tests/golden.sh [--update]
set -euo pipefail
# Under Bazel this script runs as <package>/<test name>; by hand, from tests/.
chart=${TEST_SRCDIR:+$TEST_SRCDIR/$TEST_WORKSPACE/deploy/helm/tandem}
chart=${chart:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
tests_dir=$chart/tests
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/golden.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$chart/../../../tools/helm_render/build.sh" "$work/helm_render"

render_cases() {  # $1: output directory
  local name args
  while read -r name args; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    # shellcheck disable=SC2086  # args are words by design.
    (cd "$chart" && "$work/helm_render" --chart=. $args) >"$1/$name.yaml"
    (cd "$chart" && "$work/helm_render" --chart=. --notes $args) >"$1/$name.NOTES.txt"
  done <"$tests_dir/cases.txt"
}

if [[ "${1:-}" == "--update" ]]; then
  rm -rf "$tests_dir/golden" && mkdir -p "$tests_dir/golden"
  render_cases "$tests_dir/golden"
  echo "golden renders written to $tests_dir/golden"
  exit 0
fi
mkdir -p "$work/rendered"
start=$(date +%s%N)
render_cases "$work/rendered"
echo "rendered $(ls "$work/rendered" | wc -l) files in $(( ($(date +%s%N) - start) / 1000000 )) ms"
if ! diff -ru "$tests_dir/golden" "$work/rendered"; then
  echo "golden.sh: the chart renders differently; if intended, run deploy/helm/tandem/tests/golden.sh --update" >&2
  exit 1
fi
