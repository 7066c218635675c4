#!/usr/bin/env bash
# Runs hf_reference_test.py with Debian's python3 (python3-numpy) against the engine's hf_forward.
set -euo pipefail
here=${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-}/tests/hf_reference
exec /usr/bin/python3 "$here/hf_reference_test.py" "$here/hf_forward"
