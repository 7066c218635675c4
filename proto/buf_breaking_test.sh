#!/usr/bin/env bash
# buf breaking (FILE rules, buf.yaml) of the API's protos against the committed baseline
# (proto/api_baseline.binpb), and proof that the check bites: a copy of the protos with one
# field renumbered must fail it, naming the field.
set -euo pipefail
export BUF_CACHE_DIR="$TEST_TMPDIR/buf-cache"
buf=$PWD/tools/npm/node_modules/.bin/buf
"$buf" breaking proto --against proto/api_baseline.binpb
echo "buf breaking: compatible with proto/api_baseline.binpb"

broken=$TEST_TMPDIR/broken
mkdir -p "$broken/third_party"
cp -rL buf.yaml proto "$broken/"
cp -rL third_party/googleapis "$broken/third_party/"
chmod -R u+w "$broken"
job_proto=$broken/proto/tandem/trainer/v1/trainer.proto
sed -i 's/^  string id = 1 \[(google.api.field_behavior) = OUTPUT_ONLY\];/  string id = 99 [(google.api.field_behavior) = OUTPUT_ONLY];/' \
  "$job_proto"
grep -q '  string id = 99 ' "$job_proto" || { echo "the field to renumber was not found" >&2; exit 1; }
cd "$broken"
if output=$("$buf" breaking proto --against proto/api_baseline.binpb 2>&1); then
  echo "buf breaking accepted Job.id renumbered from 1 to 99" >&2
  exit 1
fi
echo "$output"
grep -q 'field "1" with name "id" on message "Job"' <<<"$output"
echo "buf breaking: refuses a renumbered field"
