#!/usr/bin/env python3
"""gen_fuzz_seeds.py - write the seed corpus of tests/fuzz_tok.c into tests/data/fuzz/fuzz_tok/.
Each seed is one selector byte (0 tokenizer.json, 1 tokenizer.model, 2 tokenizer_config.json,
3 text) and the body. The tokenizer.model seed is a small SentencePiece ModelProto written here
field by field (sentencepiece_model.proto numbers), so the protobuf reader is fuzzed from a
valid start. Run from the repository root: python3 tests/data/tokenizers/gen_fuzz_seeds.py
"""
import json
import os
import struct

OUT = "tests/data/fuzz/fuzz_tok/"


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def field(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def spm_model():
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [("<0x%02X>" % b, 0.0, 6) for b in range(256)]
    pieces += [("\u2581", -1.0, 1), ("a", -2.0, 1), ("b", -3.0, 1), ("ab", -0.5, 1),
               ("\u2581ab", -0.25, 1), ("\u2581\u2581", -1e9, 1), ("c", -4.0, 1), ("abc", -0.1, 5)]
    body = b""
    for text, score, typ in pieces:
        p = field(1, 2, text.encode()) + field(2, 5, struct.pack("<f", score)) + field(3, 0, varint(typ))
        body += field(1, 2, p)
    trainer = field(3, 0, varint(2)) + field(35, 0, varint(1)) + field(40, 0, varint(0)) + \
        field(41, 0, varint(1)) + field(42, 0, varint(2))
    normalizer = field(1, 2, b"identity") + field(3, 0, varint(1)) + field(4, 0, varint(0)) + \
        field(5, 0, varint(1))
    return body + field(2, 2, trainer) + field(3, 2, normalizer)


def main():
    os.makedirs(OUT, exist_ok=True)
    spm_json = {"model": {"type": "BPE", "byte_fallback": True, "fuse_unk": True, "unk_token": "<unk>",
                          "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x41>": 3, "\u2581": 4, "a": 5,
                                    "b": 6, "ab": 7, "\u2581ab": 8},
                          "merges": ["a b", "\u2581 ab"]},
                "added_tokens": [{"id": 1, "content": "<s>", "special": True},
                                 {"id": 2, "content": "</s>", "special": True}],
                "normalizer": {"type": "Sequence", "normalizers": [
                    {"type": "Prepend", "prepend": "\u2581"},
                    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
                "post_processor": {"type": "TemplateProcessing",
                                   "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                              {"Sequence": {"id": "A", "type_id": 0}}],
                                   "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
                "decoder": {"type": "Strip", "content": " ", "start": 1, "stop": 0}}
    config = {"add_bos_token": True, "bos_token": {"content": "<|bos|>"}, "eos_token": "<|eot_id|>",
              "chat_template": "{{ '<|start_header_id|>' }}"}
    seeds = {
        "json_spm": b"\x00" + json.dumps(spm_json, ensure_ascii=False).encode(),
        "model_spm": b"\x01" + spm_model(),
        "config": b"\x02" + json.dumps(config).encode(),
        "text_mixed": b"\x03" + "Hello the world's 123456 <s>ab \U0001f999 caf\u00e9\u0301 <|eot_id|>\r\n\t x".encode(),
        "text_invalid": b"\x03ab\xc3\x28\xe2\x82\xf0\x9f\x98",
    }
    for name, data in seeds.items():
        with open(OUT + name, "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
