#!/usr/bin/env python3
"""gen_extra_vectors.py - write tests/data/tokenizers/extra-vectors.json: a differential corpus
(strings chosen to hit the tricky paths: whitespace runs, newlines, digits, contractions, byte
fallback, multi-script text, emoji, vocabulary pieces glued together) with the ids produced by
reference implementations we did not write:

  llama2   Debian python3-sentencepiece 0.1.97: SentencePieceProcessor(tokenizer.model).encode
  mistral  HF tokenizers (npm `tokenizers` 0.23.2, Node bindings): encode(text, false)
  llama3   same, on llama3/tokenizer.json (decompressed)
  qwen2_re llama3/tokenizer.json edited as in variant_json(): the Qwen2 split regex (\p{N} instead
           of \p{N}{1,3}) and an NFC normalizer; "nfc" says whether the text is already NFC
  gpt2_re  llama3/tokenizer.json with the pre-tokenizer replaced by ByteLevel(use_regex=true),
           i.e. the GPT-2 split regex, and ignore_merges false
  metaspace mistral/tokenizer.json with the Prepend/Replace normalizer replaced by a Metaspace
           pre-tokenizer (prepend_scheme "first", split false), as newer Llama/Mistral files have
  metaspace_split  the same with split true
  added_norm mistral/tokenizer.json plus "<|im_end|>" (special, normalized false) and
           "<|im_start|>" (not special, normalized true), as ChatML fine-tunes of Mistral add them,
           and "<L>" (lstrip) / "<R>" (rstrip)
  no_fallback mistral/tokenizer.json with byte_fallback false (unknown characters -> <unk>, fused)
The same text edits are made by tests/test_tok.c, so both sides read identical bytes.

Needs Debian's python3-sentencepiece and python3-jinja2 (run with /usr/bin/python3), and for the
HF blocks node plus `npm install tokenizers@0.23.2` in some DIR.
Run from the repository root (dev time only; CI reads the JSON):
  python3 tests/data/tokenizers/gen_extra_vectors.py [--node-tokenizers DIR]
  python3 tests/data/tokenizers/gen_extra_vectors.py --chat   (writes chat-golden.json)
DIR is a folder where `npm install tokenizers@0.23.2` was run; without it only llama2 is written.
The strings come from a fixed seed, so a rerun gives the same file.
"""
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

TOK = "tests/data/tokenizers/"
SEED = 20261130


def corpus(pieces, n_random):
    rnd = random.Random(SEED)
    fixed = [
        "", " ", "  ", "\n", "\n\n", " \n ", "\t", "a", " a", "a ", "  a  ", "Hello world",
        "Hello  world", "Hello\nworld", "Hello \n world", "\r\n", "a\r\nb", "x\n\n\ny",
        "don't", "DON'T", "we'll they're I've she'd it's I'M", "'s 's", "''s",
        "1", "12", "123", "1234", "12345678", "3.14159", "1,000,000", "x2y3z4",
        "    indented code();\n\treturn 0;\n}", "def f(x):\n    return x ** 2\n",
        "<s>", "</s>", "<unk>", "<|begin_of_text|>", "<|eot_id|>", "< s >",
        "caf\u00e9", "cafe\u0301", "na\u00efve", "\u00bfQu\u00e9?", "Stra\u00dfe", "\u0130stanbul",
        "\u4f60\u597d\uff0c\u4e16\u754c", "\u3053\u3093\u306b\u3061\u306f", "\ud55c\uad6d\uc5b4",
        "\u0645\u0631\u062d\u0628\u0627", "\u05e9\u05dc\u05d5\u05dd", "\u0928\u092e\u0938\u094d\u0924\u0947",
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440",
        "\U0001f999", "\U0001f999\U0001f999", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
        "\U0001f1fa\U0001f1f8", "a\U0001f600b", "\u00a0", "a\u00a0b", "\u3000x", "\u2028",
        "\u2003\u2003em", "x\u200by", "\ufeffBOM", "\x01\x02\x7f", "\U0010ffff",
        "\u2581", "\u2581\u2581a", "\u0120", "\u010a",
        "The llama (/\u02c8l\u0251\u02d0m\u0259/) is a domesticated South American camelid.",
        "ALL CAPS SHOUTING!!! ??? ...", "e.g. i.e. etc.", "foo@bar.com https://x.org/a?b=c&d=e",
        "$$$ %%% ^^^ &&& *** ((( )))", "---\n***\n___", "a\tb\tc", "\t\t\t", "\n\t\n\t",
        "word" * 40, " " * 37 + "x", "x" + " " * 37, "\n" * 9, "ab" * 100,
    ]
    texts = list(fixed)
    scripts = [(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
               (0x900, 0x97f), (0x3040, 0x30ff), (0x4e00, 0x9fff), (0xac00, 0xd7a3),
               (0x1f300, 0x1f6ff), (0x2000, 0x206f), (0x10000, 0x1007f)]
    for _ in range(n_random):
        kind = rnd.random()
        if kind < 0.4:
            k = rnd.randint(1, 6)
            texts.append("".join(rnd.choice(pieces) for _ in range(k)))
        elif kind < 0.8:
            out = []
            for _ in range(rnd.randint(1, 24)):
                lo, hi = rnd.choice(scripts)
                c = rnd.randint(lo, hi)
                if 0xd800 <= c <= 0xdfff:
                    c = 0x41
                out.append(chr(c))
                if rnd.random() < 0.2:
                    out.append(rnd.choice([" ", "  ", "\n", "\t", " \n", "'s", "123", "."]))
            texts.append("".join(out))
        else:
            words = ["the", "The", " of", "and", "123", "4567", "'ll", "'S", "\n", "  ", "\t",
                     "!", "?!", "...", "\u00e9t\u00e9", "\u4e2d\u6587", "\U0001f999", "x_y",
                     "(", ")", "{\n", "}\n", "  ", "\r\n", "http://", "a.b"]
            texts.append("".join(rnd.choice(words) for _ in range(rnd.randint(1, 15))))
    seen, uniq = set(), []
    for t in texts:
        if t not in seen:
            seen.add(t)
            uniq.append(t)
    return uniq


QWEN2_NORM = ('"normalizer": null,', '"normalizer": {"type": "NFC"},')
QWEN2_RE = ("\\\\p{N}{1,3}|", "\\\\p{N}|")
GPT2_PRE = '"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},\n  '


METASPACE_PRE = ('"normalizer": null,\n  "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", '
                 '"prepend_scheme": "first", "split": false},\n  ')
ADDED_NORM = ('"added_tokens": [',
              '{"id": 32000, "content": "<|im_end|>", "single_word": false, "lstrip": false, '
              '"rstrip": false, "normalized": false, "special": true}, '
              '{"id": 32001, "content": "<|im_start|>", "single_word": false, "lstrip": false, '
              '"rstrip": false, "normalized": true, "special": false}, '
              '{"id": 32002, "content": "<L>", "single_word": false, "lstrip": true, '
              '"rstrip": false, "normalized": false, "special": true}, '
              '{"id": 32003, "content": "<R>", "single_word": false, "lstrip": false, '
              '"rstrip": true, "normalized": false, "special": false}, ')
NO_FALLBACK = ('"byte_fallback": true', '"byte_fallback": false')
IGNORE_MERGES = ('"ignore_merges": true', '"ignore_merges": false')


def variant_json(text, which):
    """Edit a tokenizer.json text (llama3's, or mistral's for "metaspace"); keep in step with
    variant_json() in test_tok.c."""
    if which == "qwen2_re":
        for old, new in (QWEN2_NORM, QWEN2_RE):
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        return text
    if which == "added_norm":  # ChatML tokens added as OpenHermes-style fine-tunes do
        assert text.count(ADDED_NORM[0]) == 1
        return text.replace(ADDED_NORM[0], ADDED_NORM[0] + ADDED_NORM[1])
    if which == "no_fallback":  # mistral without byte fallback: unknown characters -> fused <unk>
        assert text.count(NO_FALLBACK[0]) == 1
        return text.replace(*NO_FALLBACK)
    if which in ("metaspace", "metaspace_split"):
        a, b = text.index('"normalizer": {'), text.index('"post_processor"')
        pre = METASPACE_PRE if which == "metaspace" else METASPACE_PRE.replace('"split": false', '"split": true')
        return text[:a] + pre + text[b:]
    a, b = text.index('"pre_tokenizer": {'), text.index('"post_processor"')
    text = text[:a] + GPT2_PRE + text[b:]
    assert text.count(IGNORE_MERGES[0]) == 1
    return text.replace(*IGNORE_MERGES)


def hf_encode(node_dir, json_path, texts):
    script = """
const { Tokenizer } = require(process.argv[2]);
const fs = require('fs');
const tok = Tokenizer.fromFile(process.argv[3]);
const texts = JSON.parse(fs.readFileSync(process.argv[4], 'utf8'));
(async () => {
  const out = [];
  for (const t of texts) { const e = await tok.encode(t, null, { addSpecialTokens: false }); out.push(Array.from(e.getIds())); }
  process.stdout.write(JSON.stringify(out));
})();
"""
    with tempfile.TemporaryDirectory() as d:
        js, tj = os.path.join(d, "enc.js"), os.path.join(d, "texts.json")
        open(js, "w").write(script)
        json.dump(texts, open(tj, "w"))
        mod = os.path.join(os.path.abspath(node_dir), "node_modules", "tokenizers")
        out = subprocess.run(["node", js, mod, os.path.abspath(json_path), tj], check=True,
                             capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    import sentencepiece as spm
    node_dir = None
    if len(sys.argv) == 3 and sys.argv[1] == "--node-tokenizers":
        node_dir = sys.argv[2]
    sp = spm.SentencePieceProcessor(model_file=TOK + "llama2/tokenizer.model")
    pieces = [sp.id_to_piece(i).replace("\u2581", " ") for i in range(259, sp.get_piece_size())]
    texts = corpus(pieces, 400)
    # the hand-written mini model of the fuzz seeds: UNUSED piece "abc" (resegmented), "▁▁"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gen_fuzz_seeds
    mini = spm.SentencePieceProcessor(model_proto=gen_fuzz_seeds.spm_model())
    mini_texts = ["ab abc c", "abcab", "aab", "  ab", "xyz", "ab  c ", "abc", "cab abc", "",
                  " ", "\u00e9", "b a", "abcabc ab"]
    result = {
        "mini_spm": {"reference": "python3-sentencepiece 0.1.97 on tests/data/fuzz/fuzz_tok/model_spm (after its selector byte)",
                     "cases": [{"text": t, "ids": mini.encode(t)} for t in mini_texts]},
        "README": "Generated by tests/data/tokenizers/gen_extra_vectors.py: ids from reference "
                  "implementations (no BOS/EOS). Used by tests/test_tok.c.",
        "llama2": {"reference": "python3-sentencepiece 0.1.97 (Debian), tokenizer.model",
                   "cases": [{"text": t, "ids": sp.encode(t)} for t in texts]},
    }
    if node_dir:
        with tempfile.TemporaryDirectory() as d:
            l3 = os.path.join(d, "llama3.json")
            open(l3, "wb").write(gzip.open(TOK + "llama3/tokenizer.json.gz").read())
            l3_texts = corpus(pieces, 400)  # also the material of extra-long below
            ids = hf_encode(node_dir, l3, l3_texts)
            result["llama3"] = {"reference": "npm tokenizers@0.23.2 (HF tokenizers), llama3/tokenizer.json, addSpecialTokens false",
                                "cases": [{"text": t, "ids": i} for t, i in zip(l3_texts, ids)]}
            raw = gzip.open(TOK + "llama3/tokenizer.json.gz").read().decode("utf-8")
            v_texts = l3_texts + ["cafe\u0301", "\u1100\u1161", "A\u030a\u0301", "\u212b",
                                  "x\u0327\u0301y", "1234567 89", "\u0661\u0662\u0663\u0664"]
            rnd = random.Random(SEED + 1)  # combining-mark soup for the NFC normalizer
            marks = [0x300, 0x301, 0x302, 0x303, 0x308, 0x30A, 0x323, 0x327, 0x328, 0x345, 0x5B4,
                     0x5BC, 0x64B, 0x650, 0x94D, 0x93C, 0x1DC0, 0x20D0, 0x3099, 0x309A, 0x0F71]
            bases = [0x41, 0x61, 0x45, 0x65, 0x4F, 0x6F, 0x55, 0x3B1, 0x3C9, 0x5D0, 0x928, 0x915,
                     0x304B, 0x30CF, 0x1100, 0x1161, 0x11A8, 0xAC00, 0x212B, 0x2126, 0x1E9B, 0xFB2C]
            for _ in range(80):
                v_texts.append("".join(chr(rnd.choice(bases if rnd.random() < 0.4 else marks))
                                       for _ in range(rnd.randint(1, 10))))
            for which in ("qwen2_re", "gpt2_re"):
                vj = os.path.join(d, which + ".json")
                open(vj, "w", encoding="utf-8").write(variant_json(raw, which))
                ids = hf_encode(node_dir, vj, v_texts)
                result[which] = {"reference": "npm tokenizers@0.23.2 on llama3/tokenizer.json edited: " + which,
                                 "cases": [{"text": t, "ids": i, "nfc": unicodedata.is_normalized("NFC", t)}
                                           for t, i in zip(v_texts, ids)]}
            raw = open(TOK + "mistral/tokenizer.json", encoding="utf-8").read()
            vj = os.path.join(d, "metaspace.json")
            open(vj, "w", encoding="utf-8").write(variant_json(raw, "metaspace"))
            m_texts = texts + ["<s>Hello", "Hi</s> there", "<s> x", "a<s>b", " <s>", "<unk>x</s>"]
            ids = hf_encode(node_dir, vj, m_texts)
            result["metaspace"] = {"reference": "npm tokenizers@0.23.2 on mistral/tokenizer.json edited: metaspace",
                                   "cases": [{"text": t, "ids": i} for t, i in zip(m_texts, ids)]}
            vj = os.path.join(d, "metaspace_split.json")
            open(vj, "w", encoding="utf-8").write(variant_json(raw, "metaspace_split"))
            ids = hf_encode(node_dir, vj, m_texts)
            result["metaspace_split"] = {"reference": "npm tokenizers@0.23.2 on mistral/tokenizer.json edited: metaspace, split true",
                                         "cases": [{"text": t, "ids": i} for t, i in zip(m_texts, ids)]}
            vj = os.path.join(d, "added_norm.json")
            open(vj, "w", encoding="utf-8").write(variant_json(raw, "added_norm"))
            a_texts = texts + [
                "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "Hi<|im_start|>x",
                "Hi <|im_start|> x", "<|im_start|>", "a<|im_end|>b", " <|im_start|>system\nYou are"
                " a bot.<|im_end|>\n<|im_start|>user\n  two  spaces <|im_start|><|im_start|>",
                "<s><|im_start|> x</s>", "x <|im_start|>",
                "a <L> b", "a  \t<L>b", " <L>", "<L>", "a<R>  b", "<R> \n x", "a <R> <L> b",
                "\u3000<L>\u3000", "x<R>"]
            ids = hf_encode(node_dir, vj, a_texts)
            result["added_norm"] = {"reference": "npm tokenizers@0.23.2 on mistral/tokenizer.json edited: added_norm",
                                    "cases": [{"text": t, "ids": i} for t, i in zip(a_texts, ids)]}
            vj = os.path.join(d, "no_fallback.json")
            open(vj, "w", encoding="utf-8").write(variant_json(raw, "no_fallback"))
            ids = hf_encode(node_dir, vj, texts)
            result["no_fallback"] = {"reference": "npm tokenizers@0.23.2 on mistral/tokenizer.json edited: byte_fallback false",
                                     "cases": [{"text": t, "ids": i} for t, i in zip(texts, ids)]}
        ids = hf_encode(node_dir, TOK + "mistral/tokenizer.json", texts)
        result["mistral"] = {"reference": "npm tokenizers@0.23.2 (HF tokenizers), mistral/tokenizer.json, addSpecialTokens false",
                             "cases": [{"text": t, "ids": i} for t, i in zip(texts, ids)]}
    if node_dir:  # one long text (crosses the C encoder's 64 KB chunking) -> extra-long.json.gz
        rnd = random.Random(SEED + 2)
        paras = []
        while sum(len(p) for p in paras) < 300000:
            paras.append(rnd.choice(l3_texts) + rnd.choice(["\n", "\n\n", " \n", "\n\t", "\r\n", ".\n"]))
        long_text = "".join(paras)
        with tempfile.TemporaryDirectory() as d:
            l3 = os.path.join(d, "llama3.json")
            open(l3, "wb").write(gzip.open(TOK + "llama3/tokenizer.json.gz").read())
            l3_ids = hf_encode(node_dir, l3, [long_text])[0]
        sp_ids = sp.encode(long_text)
        with gzip.GzipFile(TOK + "extra-long.json.gz", "wb", mtime=0) as f:
            f.write(json.dumps({"reference": "llama3: npm tokenizers@0.23.2; llama2: python3-sentencepiece 0.1.97",
                                "text": long_text, "llama3": l3_ids, "llama2": sp_ids},
                               ensure_ascii=False).encode())
    with open(TOK + "extra-vectors.json", "w") as f:
        json.dump(result, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")




# --- chat goldens ---------------------------------------------------------------------------
# Rendered with jinja2 the way transformers' apply_chat_template does (sandboxed environment,
# trim_blocks, lstrip_blocks, raise_exception), from real templates:
#   llama3, llama3_1: chat_template of tests/data/tokenizers/{llama3,llama3_1}/tokenizer_config.json
#   llama2: meta-llama/Llama-2-13b-chat-hf's template, chatml: teknium/OpenHermes-2.5-Mistral-7B's,
#   qwen2: Qwen/Qwen2-7B-Instruct's ChatML template with its default system message, as copied
#   into many public training scripts (e.g. DistillKit configs);
#   mistral_v02: mistralai/Mistral-7B-Instruct-v0.2's, as quoted in ggerganov/llama.cpp
#   tests/test-chat-template.cpp; mistral_v01: mistralai/Mistral-7B-Instruct-v0.1's, as quoted in
#   mistral.rs's chat_template tests; the transformers-generated expected outputs published there
#   are asserted below too.
LLAMA2_TEMPLATE = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
MISTRAL_V01_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
MISTRAL_V02_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
# gemma: google/gemma-2-9b-it's template (the same as gemma-7b-it's, as quoted in llama.cpp's and
# mistral.rs's template tests); gemma3: google/gemma-3-1b-it's, as quoted in several public
# projects' code; phi3: microsoft/Phi-3.5-mini-instruct's, as quoted in public template tests.
GEMMA2_TEMPLATE = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
GEMMA3_TEMPLATE = ("{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n")
PHI3_TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")
QWEN2_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CONV = [["system", "You are a helpful assistant"], ["user", "Hello"], ["assistant", "Hi there"],
        ["user", "Who are you"], ["assistant", "   I am an assistant   "], ["user", "Another question"]]
PUBLISHED = {  # transformers outputs for CONV with add_generation_prompt=True, as published
    "llama2": "<s>[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s><s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]",
    "mistral_v01": "<s>[INST] Hello [/INST]Hi there</s> [INST] Who are you [/INST]   I am an assistant   </s> [INST] Another question [/INST]",
    "chatml": "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n",
}


def render(template, messages, gen, bos, eos):
    import jinja2.sandbox

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=[{"role": r, "content": c} for r, c in messages], add_generation_prompt=gen,
        bos_token=bos, eos_token=eos)


def chat_goldens():
    cfg = lambda d: json.load(open(TOK + d + "/tokenizer_config.json"))["chat_template"]
    families = [("llama3", cfg("llama3"), "<|begin_of_text|>", "<|end_of_text|>"),
                ("llama3_1", cfg("llama3_1"), "<|begin_of_text|>", "<|eot_id|>"),
                ("llama2", LLAMA2_TEMPLATE, "<s>", "</s>"),
                ("chatml", CHATML_TEMPLATE, "", ""),
                ("qwen2", QWEN2_TEMPLATE, "", ""),
                ("mistral_v01", MISTRAL_V01_TEMPLATE, "<s>", "</s>"),
                ("mistral_v02", MISTRAL_V02_TEMPLATE, "<s>", "</s>"),
                ("gemma2", GEMMA2_TEMPLATE, "<|begin_of_text|>", "<|end_of_text|>"),
                ("gemma3", GEMMA3_TEMPLATE, "<|begin_of_text|>", "<|end_of_text|>"),
                ("phi3", PHI3_TEMPLATE, "<|begin_of_text|>", "<|end_of_text|>")]
    convs = [CONV, CONV[1:], [["user", "  \u00bfQu\u00e9 tal?\n"]],
             [["system", " sys\n"], ["user", "\U0001f999 a\tb "], ["assistant", "\nok"], ["user", "x"]]]
    convs.append([["system", ""], ["user", "hi"]])  # an empty system message (Phi-3.5 skips it)
    cases = []
    for name, tmpl, bos, eos in families:
        for conv in convs:
            if name.startswith(("mistral", "gemma2")) and conv[0][0] == "system":
                conv = conv[1:]  # no system role in Mistral's and Gemma 2's templates
            for gen in (True, False):
                out = render(tmpl, conv, gen, bos, eos)
                published_conv = CONV[1:] if name.startswith("mistral") else CONV
                if gen and name in PUBLISHED and conv == published_conv:
                    assert out == PUBLISHED[name], name
                cases.append({"family": name, "messages": conv, "add_generation_prompt": gen,
                              "template": tmpl, "text": out})
    return cases


def meta_llama2_ids(text, sp):
    """Ids of a rendered Llama-2 chat prompt the way Meta's llama code builds them
    (llama/generation.py chat_completion: per turn [bos] + encode(turn text) [+ eos]), i.e. the
    text between <s> / </s> encoded by sentencepiece, which adds its dummy prefix to each."""
    import re
    ids = []
    for part in re.split(r"(<s>|</s>)", text):
        if part == "<s>":
            ids.append(1)
        elif part == "</s>":
            ids.append(2)
        elif part:
            ids.extend(sp.encode(part))
    return ids


def write_chat_goldens():
    import jinja2
    cases = chat_goldens()
    try:  # sentencepiece lives in Debian's python3, jinja2 in the other one: run both ways
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=TOK + "llama2/tokenizer.model")
        for c in cases:
            if c["family"] == "llama2":
                c["ids_llama2_meta"] = meta_llama2_ids(c["text"], sp)
    except ImportError:  # keep the ids of the file being replaced where the text is the same
        old = {}
        if os.path.exists(TOK + "chat-golden.json"):
            for c in json.load(open(TOK + "chat-golden.json"))["cases"]:
                if "ids_llama2_meta" in c:
                    old[(c["family"], c["text"])] = c["ids_llama2_meta"]
        for c in cases:
            if (c["family"], c["text"]) in old:
                c["ids_llama2_meta"] = old[(c["family"], c["text"])]
        print("note: no sentencepiece here, ids_llama2_meta kept from the previous file: %d"
              % sum("ids_llama2_meta" in c for c in cases), file=sys.stderr)
    with open(TOK + "chat-golden.json", "w") as f:
        json.dump({"README": "chat prompts rendered by jinja2 %s from real chat templates; "
                             "written by gen_extra_vectors.py --chat" % jinja2.__version__,
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--chat"]:
        write_chat_goldens()
    else:
        main()
