#!/usr/bin/env bash
# The alert and recording rules are valid, each behaves as its unit tests say, and each alert
# points to its runbook (docs/operations.md, "Alerts and runbooks": a "### <alert>" section).
set -euo pipefail
cd "$(dirname "$0")"
promtool check rules ../helm/tandem/files/tandem-rules.yaml
promtool test rules tandem-rules.test.yaml
python3 - ../helm/tandem/files/tandem-rules.yaml <<'PY'
import sys
import yaml

groups = yaml.safe_load(open(sys.argv[1]))["groups"]
base = "https://github.com/tandem-rl/tandem/blob/main/docs/operations.md#"
wrong = [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule and
         rule.get("annotations", {}).get("runbook_url") != base + rule["alert"].lower()]
if wrong:
    sys.exit(f"alerts without runbook_url {base}<alert name in lower case>: {wrong}")
PY
