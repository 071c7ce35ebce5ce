// gen_falcon_vectors.mjs - reference ids of Falcon's pre-tokenizer Sequence (tiiuae/falcon-7b's
// tokenizer.json: Punctuation Contiguous, ByteLevel use_regex, Digits individual_digits false,
// Split "[0-9][0-9][0-9]" Isolated) from Hugging Face's own JavaScript tokenizers
// (@huggingface/tokenizers 0.2.0, npm), applied to llama3/tokenizer.json.gz's byte-level BPE
// vocabulary and merges with that pre_tokenizer in place of its own (Falcon's vocabulary is not
// in this repository). tests/test_tok.c (t_tok_falcon.h) makes the same tokenizer and compares.
//   cd /tmp && npm install --ignore-scripts @huggingface/tokenizers@0.2.0 && \
//   NODE_PATH=/tmp/node_modules node tests/data/tokenizers/gen_falcon_vectors.mjs
import fs from "fs";
import path from "path";
import zlib from "zlib";
import { createRequire } from "module";

const require = createRequire(path.join(process.env.NODE_PATH || ".", "x.js"));
const { Tokenizer } = require("@huggingface/tokenizers");
const dir = path.dirname(new URL(import.meta.url).pathname);
const tj = JSON.parse(zlib.gunzipSync(fs.readFileSync(path.join(dir, "llama3/tokenizer.json.gz"))).toString());
export const FALCON_PRETOK = {type: "Sequence", pretokenizers: [
  {type: "Punctuation", behavior: "Contiguous"},
  {type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true},
  {type: "Digits", individual_digits: false},
  {type: "Split", pattern: {Regex: "[0-9][0-9][0-9]"}, behavior: "Isolated", invert: false}]};
tj.pre_tokenizer = FALCON_PRETOK;
const tok = new Tokenizer(tj, {});

const fixed = [
  "Hello, world! don't 12345 3.14159 $1,000,000...", "  a\n\nb ¿Qué? — «x»", "I'm fine; you're not.",
  "1234567890", "0", "12", "123", "1234", "a1b22c333d4444", "(x+y)*z==42!?", "...---...",
  "email: someone@example.com", "https://example.org/a?b=1&c=2#frag", "tab\tsep\tvalues 9\t99",
  "The year 2023 had 365 days.", "Ünïcödé wörds, ñ and ß.", "日本語、テスト。123", "emoji 🦙🔥 42",
  "   leading and trailing   ", "line1\r\nline2\n", "x'y\"z`w", "__init__.py", "a--b---c",
  "#1 #22 #333", "1.2.3.4", "-5 +6 ~7", "[1, 2, 3]", "{\"k\": 10}", "", "!!!", "٣٤٥ ١٢", "½ ² ³",
];
// deterministic random strings over a mixed alphabet
let st = 12345;
const rnd = () => (st = (st * 1103515245 + 12345) % 2147483648) / 2147483648;
const alpha = ["a", "b", "Z", " ", " ", "0", "1", "7", "9", ",", ".", "!", "'", "-", "(", ")", "\n", "é", "¿", "—", "…", "$", "%", "日"];
const rand = [];
for (let i = 0; i < 120; i++) {
  let s = "";
  const n = 1 + Math.floor(rnd() * 24);
  for (let j = 0; j < n; j++) s += alpha[Math.floor(rnd() * alpha.length)];
  rand.push(s);
}
const cases = [...fixed, ...rand].map((text) => ({text, ids: Array.from(tok.encode(text, {add_special_tokens: false}).ids)}));
fs.writeFileSync(path.join(dir, "falcon-pretok-vectors.json"), JSON.stringify({
  README: "ids of @huggingface/tokenizers 0.2.0 (npm) for llama3's BPE with Falcon's pre_tokenizer; written by gen_falcon_vectors.mjs",
  pre_tokenizer: FALCON_PRETOK, cases}, null, 1) + "\n");
console.log("cases:", cases.length);
