#!/usr/bin/env bash
# Runs the cluster harness's test: it needs root and the machine's real network namespaces,
# hence tag "local" (no sandbox) in BUILD.bazel.
set -euo pipefail
exec python3 "$(dirname "$0")/cluster_test.py" -v
