#!/usr/bin/env bash
# The model graph must not read or write its activations: only backends reach the memory behind a
# Ref (buffer_access.h). checked_graph_test proves at run time that the graph does not; this keeps
# the way to do it out of the graph's sources.
set -euo pipefail
root=${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-}
status=0
for source in "$@"; do
  if grep -nE 'buffer_access\.h|BufferAccess' "$root/$source"; then
    echo "$source: the model graph must not reach behind its buffers" >&2
    status=1
  fi
done
[[ $# -gt 0 ]] || { echo "no graph sources given" >&2; exit 1; }
exit "$status"
