// Renders each conversation of a JSON file with a tokenizer_config.json's chat_template through
// @huggingface/jinja (the Jinja implementation of transformers.js); prints one JSON string per
// line, as chat_render does.
//   node reference_chat.mjs TOKENIZER_CONFIG CONVERSATIONS
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const [configPath, conversationsPath] = process.argv.slice(2);
const require = createRequire(process.env.TANDEM_NODE_MODULES + "/");
const { Template } = require("@huggingface/jinja");

const template = new Template(JSON.parse(readFileSync(configPath, "utf8")).chat_template);
for (const conversation of JSON.parse(readFileSync(conversationsPath, "utf8"))) {
  process.stdout.write(JSON.stringify(template.render(conversation)) + "\n");
}
