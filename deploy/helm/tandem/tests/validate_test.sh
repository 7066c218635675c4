#!/usr/bin/env bash
# What the chart takes and renders is valid: each values file against values.schema.json (and a
# typo or a wrong type is refused, as `helm install` refuses it), and every object of every case
# against the Kubernetes (and CRD) OpenAPI schemas.
set -euo pipefail
# Under Bazel this script runs as <package>/<test name>; by hand, from tests/.
lib=${TEST_SRCDIR:+$TEST_SRCDIR/$TEST_WORKSPACE/deploy/helm/tandem/tests/render_lib.sh}
source "${lib:-$(dirname "${BASH_SOURCE[0]}")/render_lib.sh}"
validate=(node "$tests_dir/validate.cjs")

"${validate[@]}" values "$chart" "$chart"/values-*.yaml
printf 'rollout:\n  replica: 3\n' >"$work/typo.yaml"
printf 'rollout:\n  replicas: "3"\n' >"$work/wrong-type.yaml"
printf 'routerReplay:\n  fsync: sometimes\n' >"$work/bad-enum.yaml"
printf 'trainer:\n  expertLinkGbps: -1\n' >"$work/negative-rate.yaml"
for bad in typo wrong-type bad-enum negative-rate; do
  if "${validate[@]}" values "$chart" "$work/$bad.yaml" 2>"$work/$bad.err"; then
    echo "validate_test: values $bad.yaml passed the schema" >&2
    exit 1
  fi
  echo "refused as it should be: $(cat "$work/$bad.err")"
done

# The Pod Security level each case's pods need, as docs/deploy.md states it: RDMA's IPC_LOCK
# needs `privileged`; every other case meets `restricted`.
declare -A pod_security=([gpu-rdma]=privileged)
validate_manifests() {
  "${validate[@]}" manifests "$2"
  local level expected=${pod_security[$1]:-restricted}
  level=$("${validate[@]}" podsecurity "$2" 2>"$work/$1.podsecurity")
  if [[ "$level" != "$expected" ]]; then
    echo "validate_test: case $1 needs Pod Security level $level, documented as $expected:" >&2
    cat "$work/$1.podsecurity" >&2
    return 1
  fi
  echo "$1: pods meet Pod Security level $level"
}
for_each_case validate_manifests "$work"

# The render itself refuses what no values schema can: TLS without a certificate source.
if (cd "$chart" && "$work/helm_render" --chart=. --set tls.enabled=true) >/dev/null 2>"$work/tls.err"; then
  echo "validate_test: tls.enabled without a certificate rendered" >&2
  exit 1
fi
grep -q "tls.existingSecret (or tls.certManager.enabled) is required" "$work/tls.err"

# Nor a /dev/shm at or over the container's memory limit, which counts it.
if (cd "$chart" && "$work/helm_render" --chart=. --set weightStore.shmSize=4Gi) >/dev/null 2>"$work/shm.err"; then
  echo "validate_test: a weight-store /dev/shm as large as its memory limit rendered" >&2
  exit 1
fi
grep -q "weightStore.shmSize (4Gi) must be less than weightStore.resources.limits.memory (4Gi)" "$work/shm.err"

# Names that no release can make valid are refused by the schema: an override with a dot.
printf 'fullnameOverride: my.tandem\n' >"$work/dotted-override.yaml"
if "${validate[@]}" values "$chart" "$work/dotted-override.yaml" 2>"$work/dotted-override.err"; then
  echo "validate_test: fullnameOverride with a dot passed the schema" >&2
  exit 1
fi
