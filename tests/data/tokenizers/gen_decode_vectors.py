#!/usr/bin/env python3
"""gen_decode_vectors.py - write tests/data/tokenizers/decode-vectors.json: token-id sequences
full of byte-fallback tokens (valid, truncated and invalid UTF-8 runs, runs broken by pieces and
by special tokens) with the text that the reference decoders give for them:

  hf_llama2   HF tokenizers (npm `tokenizers` 0.23.2, Node bindings) on llama2/tokenizer.json:
              decode(ids, skip_special_tokens) for skip false and true
  hf_mistral  the same on mistral/tokenizer.json
  spm_llama2  Debian python3-sentencepiece 0.1.97 on llama2/tokenizer.model: decode(ids)
              (sentencepiece never prints control tokens: the C side decodes these with
              skip_special_tokens; no <unk> in these cases)

The rule they show (tests/test_tok.c checks rt_tok_decode against every case):
  HF decoders/byte_fallback.rs: a run of consecutive <0xXX> tokens that is valid UTF-8 becomes
  its text, else every byte of the run becomes U+FFFD.
  sentencepiece ProcessBytePieces: within a run, each valid character is kept and each byte
  that does not start one becomes U+FFFD.

Needs node and `npm install tokenizers@0.23.2` in DIR, and Debian's python3-sentencepiece (run
with /usr/bin/python3). On a machine with the Python packages instead (tokenizers 0.23,
sentencepiece 0.2.2) run it with --python: the same cases through those bindings.
Run from the repository root (dev time only; CI reads the JSON):
  /usr/bin/python3 tests/data/tokenizers/gen_decode_vectors.py --node-tokenizers DIR
  python3 tests/data/tokenizers/gen_decode_vectors.py --python [--check]
--check compares with the stored JSON instead of writing it (exit 1 on a difference).
"""
import json
import os
import random
import subprocess
import sys
import tempfile

TOK = "tests/data/tokenizers/"
OUT = TOK + "decode-vectors.json"
SEED = 20261218
BYTE0 = 3  # <0x00> in the Llama-2 and Mistral vocabularies


def byte(b):
    return BYTE0 + b


def utf8_ids(s):
    return [byte(b) for b in s.encode("utf-8")]


def cases():
    """Fixed cases first, then random mixes (fixed seed)."""
    fixed = [
        [byte(0xE2), byte(0x96)],                       # truncated 3-byte sequence
        [byte(0xFF), byte(0x41)],                       # invalid byte, then 'A' as a byte token
        [byte(0xE2), byte(0x41), byte(0x96)],
        utf8_ids("\U0001F999"),                         # valid 4-byte run
        utf8_ids("\u00e9") + [byte(0xFF)],              # valid char, then an invalid byte
        utf8_ids("\u20ac") + [byte(0xFF)] + utf8_ids("\u20ac"),
        [byte(0xE2), byte(0x82), 1000, byte(0xAC)],     # a piece ends the run
        [1, byte(0xE2), 2, byte(0x82), byte(0xAC)],     # special tokens inside a run
        [byte(0xC0), byte(0xAF)],                       # overlong
        [byte(0xED), byte(0xA0), byte(0x80)],           # surrogate
        [byte(0xF4), byte(0x90), byte(0x80), byte(0x80)],  # > U+10FFFF
        [byte(0x80)],                                   # lone continuation
        [byte(0x20), byte(0xFF)],                       # a space byte at the start of a bad run
        [byte(0x20)] + utf8_ids("x"),
        [450, byte(0xF0), byte(0x9F), byte(0xA6)],      # run ends inside a character at the end
    ]
    rnd = random.Random(SEED)
    out = list(fixed)
    pieces = [450, 1000, 2996, 3186, 29871, 29889, 13]  # "▁The", "ied", ..., "▁", ".", <0x0A>
    for _ in range(200):
        seq = []
        for _ in range(rnd.randint(1, 10)):
            r = rnd.random()
            if r < 0.45:
                seq.append(byte(rnd.choice([rnd.randint(0x80, 0xFF), rnd.randint(0xC2, 0xF4),
                                            rnd.randint(0x80, 0xBF)])))
            elif r < 0.7:
                c = chr(rnd.choice([rnd.randint(0x80, 0x7FF), rnd.randint(0x800, 0xD7FF),
                                    rnd.randint(0x10000, 0x1FFFF)]))
                seq += utf8_ids(c)
            elif r < 0.9:
                seq.append(rnd.choice(pieces))
            else:
                seq.append(rnd.choice([1, 2]))
        out.append(seq)
    return out


def spm_cases(all_cases):
    return [c for c in all_cases if 0 not in c]


NODE_JS = r"""
const {Tokenizer} = require(process.argv[2]);
const fs = require('fs');
(async () => {
  const t = Tokenizer.fromFile(process.argv[3]);
  const cases = JSON.parse(fs.readFileSync(process.argv[4], 'utf8'));
  const out = [];
  for (const ids of cases) {
    out.push([await t.decode(ids, false), await t.decode(ids, true)]);
  }
  fs.writeFileSync(process.argv[4], JSON.stringify(out));
})();
"""


def hf_node(node_dir, tok_json, all_cases):
    with tempfile.TemporaryDirectory() as d:
        js, cj = os.path.join(d, "dec.js"), os.path.join(d, "cases.json")
        open(js, "w").write(NODE_JS)
        open(cj, "w").write(json.dumps(all_cases))
        mod = os.path.join(os.path.abspath(node_dir), "node_modules", "tokenizers")
        subprocess.run(["node", js, mod, os.path.abspath(tok_json), cj], check=True)
        return json.load(open(cj))


def hf_python(tok_json, all_cases):
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(tok_json)
    return [[t.decode(c, skip_special_tokens=False), t.decode(c, skip_special_tokens=True)]
            for c in all_cases]


def spm_decode(all_cases):
    import sentencepiece
    p = sentencepiece.SentencePieceProcessor(model_file=TOK + "llama2/tokenizer.model")
    return [p.decode(c) for c in all_cases], "sentencepiece " + sentencepiece.__version__


def main():
    args = sys.argv[1:]
    check = "--check" in args
    all_cases = cases()
    if "--python" in args:
        import tokenizers
        ref = "HF tokenizers %s (Python)" % tokenizers.__version__
        hf = {k: hf_python(TOK + k + "/tokenizer.json", all_cases) for k in ("llama2", "mistral")}
    elif "--node-tokenizers" in args:
        node_dir = args[args.index("--node-tokenizers") + 1]
        ref = "HF tokenizers 0.23.2 (npm tokenizers, Node bindings)"
        hf = {k: hf_node(node_dir, TOK + k + "/tokenizer.json", all_cases)
              for k in ("llama2", "mistral")}
    else:
        sys.exit(__doc__)
    sc = spm_cases(all_cases)
    spm, spm_ref = spm_decode(sc)
    result = {
        "about": "tests/data/tokenizers/gen_decode_vectors.py: byte-fallback decoding",
        "hf_llama2": {"reference": ref + ", llama2/tokenizer.json",
                      "cases": [{"ids": c, "text": t[0], "text_skip_special": t[1]}
                                for c, t in zip(all_cases, hf["llama2"])]},
        "hf_mistral": {"reference": ref + ", mistral/tokenizer.json",
                       "cases": [{"ids": c, "text": t[0], "text_skip_special": t[1]}
                                 for c, t in zip(all_cases, hf["mistral"])]},
        "spm_llama2": {"reference": spm_ref + ", llama2/tokenizer.model (control tokens "
                                              "never printed: compare with skip_special)",
                       "cases": [{"ids": c, "text_skip_special": t} for c, t in zip(sc, spm)]},
    }
    # one case per line: reviewable, and small enough to diff
    lines = ["{", ' "about": %s,' % json.dumps(result["about"])]
    blocks = [k for k in result if k != "about"]
    for bi, k in enumerate(blocks):
        lines.append(' %s: {"reference": %s, "cases": [' % (json.dumps(k), json.dumps(result[k]["reference"])))
        cs = result[k]["cases"]
        for ci, c in enumerate(cs):
            lines.append("  " + json.dumps(c, ensure_ascii=False) + ("," if ci + 1 < len(cs) else ""))
        lines.append(" ]}" + ("," if bi + 1 < len(blocks) else ""))
    lines.append("}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == result
    if check:
        old = json.load(open(OUT))
        diff = [k for k in ("hf_llama2", "hf_mistral", "spm_llama2")
                if old[k]["cases"] != result[k]["cases"]]
        print("decode vectors: %s" % ("same as " + OUT if not diff else "DIFFER: " + ", ".join(diff)))
        sys.exit(1 if diff else 0)
    open(OUT, "w").write(text)
    print("wrote %s: %d cases (HF), %d (sentencepiece)" % (OUT, len(all_cases), len(sc)))


if __name__ == "__main__":
    main()
