// Encodes each JSON-string line of a corpus with @huggingface/tokenizers (tokenizers.js, the
// reference JavaScript port of the Rust tokenizers crate) from a tokenizer.json and its
// tokenizer_config.json; prints one JSON array of ids per line, as hf_tokenize does, and on
// stderr the encoding speed over --repeat passes.
//   node reference_tokenize.mjs TOKENIZER_DIR CORPUS [REPEAT]
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const [directory, corpusPath, repeatArgument] = process.argv.slice(2);
const require = createRequire(process.env.TANDEM_NODE_MODULES + "/");
const { Tokenizer } = require("@huggingface/tokenizers");

const tokenizer = new Tokenizer(
  JSON.parse(readFileSync(`${directory}/tokenizer.json`, "utf8")),
  JSON.parse(readFileSync(`${directory}/tokenizer_config.json`, "utf8")),
);
const texts = readFileSync(corpusPath, "utf8").split("\n").filter(Boolean).map(JSON.parse);
const encode = (text) => tokenizer.encode(text, { add_special_tokens: false }).ids;

process.stdout.write(texts.map((text) => JSON.stringify(encode(text))).join("\n") + "\n");
const repeat = Number(repeatArgument ?? 1);
let tokens = 0;
const start = process.hrtime.bigint();
for (let pass = 0; pass < repeat; ++pass) {
  for (const text of texts) tokens += encode(text).length;
}
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
process.stderr.write(`tokenizers.js: ${tokens} tokens in ${seconds.toFixed(3)} s: ` +
                     `${Math.round(tokens / seconds)} tokens/s\n`);
