#!/usr/bin/env bash
# Fails naming every line of the checked sources (this test's data) that builds a bare
# INVALID_ARGUMENT: a client could not tell which field was wrong (docs/contributing.md,
# "Where things go").
set -euo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
checked=$(find -L services -name '*.cc' -o -name '*.h' | wc -l)
if [ "$checked" -lt 50 ]; then
  echo "only $checked sources found: the test's data is broken"
  exit 1
fi
if grep -Rn --include='*.cc' --include='*.h' 'absl::InvalidArgumentError(' services; then
  echo "bare absl::InvalidArgumentError above: use InvalidField or InvalidRequest (common/status.h)"
  exit 1
fi
echo "$checked sources checked: every INVALID_ARGUMENT carries its details"
