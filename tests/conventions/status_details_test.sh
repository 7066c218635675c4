#!/usr/bin/env bash
# Fails naming every line of the checked sources (this test's data) that builds a bare
# INVALID_ARGUMENT: a client could not tell which field was wrong (docs/contributing.md,
# "Where things go").
set -euo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
# Each tree must be there in full: a missing `sources` filegroup would pass unchecked.
count_sources() {
  { find -L "$1" \( -name '*.cc' -o -name '*.h' -o -name '*.cu' \) 2>/dev/null || true; } | wc -l
}
checked=0
for tree_and_minimum in services/rollout:30 services/weight_store:30 services/router_replay:30 \
  services/trainer:60 common:60; do
  tree=${tree_and_minimum%:*}
  minimum=${tree_and_minimum#*:}
  found=$(count_sources "$tree")
  if [ "$found" -lt "$minimum" ]; then
    echo "only $found sources found under $tree (want >= $minimum): the test's data is broken"
    exit 1
  fi
  checked=$((checked + found))
done
# common/status.cc builds the detailed statuses out of a bare one, and common/status_test.cc
# tests converting bare statuses: the only two files allowed one.
bare=$(grep -Rn --include='*.cc' --include='*.h' --include='*.cu' 'absl::InvalidArgumentError(' \
  services common | grep -v -e '^common/status\.cc:' -e '^common/status_test\.cc:' || true)
if [ -n "$bare" ]; then
  echo "$bare"
  echo "bare absl::InvalidArgumentError above: use InvalidField or InvalidRequest (common/status.h)"
  exit 1
fi
echo "$checked sources checked: every INVALID_ARGUMENT carries its details"
