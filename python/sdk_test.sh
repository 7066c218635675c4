#!/usr/bin/env bash
# Installs the SDK the way README says -- `pip install --no-build-isolation` into a fresh venv
# that sees Debian's packages, offline -- then runs its pytest suite (tests/) against the four
# services built here. Each pytest case is reported in the test's XML.
set -euo pipefail
runfiles=$TEST_SRCDIR/$TEST_WORKSPACE
work=$TEST_TMPDIR
mkdir -p "$work/src/third_party"
cp -rL "$runfiles/python" "$runfiles/proto" "$work/src/"
cp -rL "$runfiles/third_party/googleapis" "$work/src/third_party/"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$work/venv/bin/pip" install --quiet --no-cache-dir \
  --no-build-isolation --no-index "$work/src/python"
cd "$work"  # Not the source tree: the installed package, with its generated stubs, is imported.
TANDEM_BINARIES=$runfiles exec "$work/venv/bin/python" -m pytest -p no:cacheprovider -q \
  --basetemp="$work/pytest" --junitxml="${XML_OUTPUT_FILE:-$work/pytest.xml}" "$work/src/python/tests"
