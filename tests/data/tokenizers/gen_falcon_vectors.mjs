// gen_falcon_vectors.mjs - reference ids of Falcon's pre-tokenizer Sequence (tiiuae/falcon-7b's
// tokenizer.json: Punctuation Contiguous, ByteLevel use_regex, Digits individual_digits false,
// Split "[0-9][0-9][0-9]" Isolated) from Hugging Face's tokenizers library itself (npm
// `tokenizers` 0.23.2: the Rust crate behind a Node binding), applied to llama3/tokenizer.json.gz's byte-level BPE
// vocabulary and merges with that pre_tokenizer in place of its own (Falcon's vocabulary is not
// in this repository). tests/test_tok.c (t_tok_falcon.h) makes the same tokenizer and compares.
//   cd /tmp && npm install tokenizers@0.23.2 && \
//   NODE_PATH=/tmp/node_modules node tests/data/tokenizers/gen_falcon_vectors.mjs
// (The pure-JavaScript @huggingface/tokenizers 0.2.0 differs from the Rust library on Digits:
// it tests ASCII digits where digits.rs tests char::is_numeric on the byte-mapped text, in
// which the bytes 0xB2 0xB3 0xB9 0xBC-0xBE are ² ³ ¹ ¼ ½ ¾; the Rust one is the reference.)
import fs from "fs";
import path from "path";
import zlib from "zlib";
import { createRequire } from "module";

const require = createRequire(path.join(process.env.NODE_PATH || ".", "x.js"));
const { Tokenizer } = require("tokenizers");
const dir = path.dirname(new URL(import.meta.url).pathname);
const tj = JSON.parse(zlib.gunzipSync(fs.readFileSync(path.join(dir, "llama3/tokenizer.json.gz"))).toString());
export const FALCON_PRETOK = {type: "Sequence", pretokenizers: [
  {type: "Punctuation", behavior: "Contiguous"},
  {type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true},
  {type: "Digits", individual_digits: false},
  {type: "Split", pattern: {Regex: "[0-9][0-9][0-9]"}, behavior: "Isolated", invert: false}]};
tj.pre_tokenizer = FALCON_PRETOK;
const tok = Tokenizer.fromString(JSON.stringify(tj));

const fixed = [
  "Hello, world! don't 12345 3.14159 $1,000,000...", "  a\n\nb ¿Qué? — «x»", "I'm fine; you're not.",
  "1234567890", "0", "12", "123", "1234", "a1b22c333d4444", "(x+y)*z==42!?", "...---...",
  "email: someone@example.com", "https://example.org/a?b=1&c=2#frag", "tab\tsep\tvalues 9\t99",
  "The year 2023 had 365 days.", "Ünïcödé wörds, ñ and ß.", "日本語、テスト。123", "emoji 🦙🔥 42",
  "   leading and trailing   ", "line1\r\nline2\n", "x'y\"z`w", "__init__.py", "a--b---c",
  "#1 #22 #333", "1.2.3.4", "-5 +6 ~7", "[1, 2, 3]", "{\"k\": 10}", "", "!!!", "٣٤٥ ١٢", "½ ² ³",
  // characters whose UTF-8 holds a byte that maps to a numeric character (² ³ ¹ ¼ ½ ¾)
  "в мой", "über", "x²", "²34", "1²345", "１２３４", "12²3456", "Ölçü 1234", "ЖЗИЙ 99999",
  " ", "   ", "\n", " \n ", "  \n\n  1234", "x\u00a0123456",
];
// deterministic random strings over a mixed alphabet
let st = 12345;
const rnd = () => (st = (st * 1103515245 + 12345) % 2147483648) / 2147483648;
const alpha = ["a", "b", "Z", " ", " ", "0", "1", "7", "9", ",", ".", "!", "'", "-", "(", ")", "\n", "é", "¿", "—", "…", "$", "%", "日",
               "в", "ü", "²", "½", "ж"];
const rand = [];
for (let i = 0; i < 120; i++) {
  let s = "";
  const n = 1 + Math.floor(rnd() * 24);
  for (let j = 0; j < n; j++) s += alpha[Math.floor(rnd() * alpha.length)];
  rand.push(s);
}
const cases = [];
for (const text of [...fixed, ...rand]) {
  const e = await tok.encode(text, null, {addSpecialTokens: false});
  cases.push({text, ids: Array.from(e.getIds())});
}
fs.writeFileSync(path.join(dir, "falcon-pretok-vectors.json"), JSON.stringify({
  README: "ids of the tokenizers library 0.23.2 (npm, Rust) for llama3's BPE with Falcon's pre_tokenizer; written by gen_falcon_vectors.mjs",
  pre_tokenizer: FALCON_PRETOK, cases}, null, 1) + "\n");
console.log("cases:", cases.length);
