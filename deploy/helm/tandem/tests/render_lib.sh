# Sourced by the chart's test scripts: sets chart, tests_dir and work (a temporary directory
# removed on exit), builds the renderer into $work/helm_render, and defines for_each_case.

chart=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tests_dir=$chart/tests
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/chart.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$chart/../../../tools/helm_render/build.sh" "$work/helm_render"

# Renders every case of cases.txt: calls "$1" NAME MANIFESTS NOTES for each, with the render's
# manifests and NOTES.txt in files under $2.
for_each_case() {
  local name args
  while read -r name args; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    # shellcheck disable=SC2086  # args are words by design.
    (cd "$chart" && "$work/helm_render" --chart=. $args) >"$2/$name.yaml"
    # shellcheck disable=SC2086
    (cd "$chart" && "$work/helm_render" --chart=. --notes $args) >"$2/$name.NOTES.txt"
    "$1" "$name" "$2/$name.yaml" "$2/$name.NOTES.txt"
  done <"$tests_dir/cases.txt"
}
