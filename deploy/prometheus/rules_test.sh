#!/usr/bin/env bash
# The alert and recording rules are valid and each behaves as its unit test says.
set -euo pipefail
cd "$(dirname "$0")"
promtool check rules ../helm/tandem/files/tandem-rules.yaml
promtool test rules tandem-rules.test.yaml
