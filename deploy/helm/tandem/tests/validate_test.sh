#!/usr/bin/env bash
# What the chart takes and renders is valid: each values file against values.schema.json (and a
# typo or a wrong type is refused, as `helm install` refuses it), and every object of every case
# against the Kubernetes (and CRD) OpenAPI schemas.
set -euo pipefail
# Under Bazel this script runs as <package>/<test name>; by hand, from tests/.
chart=${TEST_SRCDIR:+$TEST_SRCDIR/$TEST_WORKSPACE/deploy/helm/tandem}
chart=${chart:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
tests_dir=$chart/tests
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/validate.XXXXXX")
trap 'rm -rf "$work"' EXIT
validate=(node "$tests_dir/validate.cjs")

"${validate[@]}" values "$chart" "$chart"/values-*.yaml
printf 'rollout:\n  replica: 3\n' >"$work/typo.yaml"
printf 'rollout:\n  replicas: "3"\n' >"$work/wrong-type.yaml"
printf 'routerReplay:\n  fsync: sometimes\n' >"$work/bad-enum.yaml"
for bad in typo wrong-type bad-enum; do
  if "${validate[@]}" values "$chart" "$work/$bad.yaml" 2>"$work/$bad.err"; then
    echo "validate_test: values $bad.yaml passed the schema" >&2
    exit 1
  fi
  echo "refused as it should be: $(cat "$work/$bad.err")"
done

"$chart/../../../tools/helm_render/build.sh" "$work/helm_render"
while read -r name args; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  # shellcheck disable=SC2086  # args are words by design.
  (cd "$chart" && "$work/helm_render" --chart=. $args) >"$work/$name.yaml"
  "${validate[@]}" manifests "$work/$name.yaml"
done <"$tests_dir/cases.txt"

# The render itself refuses what no values schema can: TLS without a certificate source.
if (cd "$chart" && "$work/helm_render" --chart=. --set tls.enabled=true) >/dev/null 2>"$work/tls.err"; then
  echo "validate_test: tls.enabled without a certificate rendered" >&2
  exit 1
fi
grep -q "tls.existingSecret (or tls.certManager.enabled) is required" "$work/tls.err"
