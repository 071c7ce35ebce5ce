#!/usr/bin/env python3
"""The demo model's tokenizer: SentencePiece BPE with byte fallback, Llama-2's settings, 4096 pieces.

    python3 tools/train/tokenizer.py train   # Debian (sentencepiece package): rewrite data/tokenizer.model

`train` runs Debian's spm_train on the training split (corpus.py; one chapter paragraph or heading
per line, so every piece is learnt from the training books only) with the trainer settings of
Llama-2's tokenizer.model (as its trainer_spec lists them): BPE, byte_fallback, split_digits,
identity normalization, add_dummy_prefix, remove_extra_whitespaces false, whitespace-only pieces
allowed, max piece length 16, ids unk 0 / <s> 1 / </s> 2, no pad. Differences: 4096 pieces, all
characters covered (the text is ASCII), all sentences used in file order, and a sentence length
limit of 100000 bytes (chapters are up to 13 KB). The file's bytes depend only on the input and
these flags (relative paths are used, because the trainer_spec records them); its sha256 is in
data/SHA256SUMS.

On the GPU machine (transformers) make_tokenizer_json() writes the tokenizer.json of the same
tokenizer by transformers' own SentencePiece conversion and checks that the HF tokenizer, the
`tokenizers` library on the written file and the sentencepiece library give identical ids.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import corpus
from util import CheckFailed, log, write_bytes_atomic

TOKENIZER = os.path.join(corpus.DATA, "tokenizer.model")
VOCAB = 4096
SPM_FLAGS = ["--model_type=bpe", "--vocab_size=%d" % VOCAB, "--byte_fallback=true", "--split_digits=true",
             "--normalization_rule_name=identity", "--add_dummy_prefix=true", "--remove_extra_whitespaces=false",
             "--allow_whitespace_only_pieces=true", "--unk_id=0", "--bos_id=1", "--eos_id=2", "--pad_id=-1",
             "--character_coverage=1.0", "--max_sentencepiece_length=16", "--max_sentence_length=100000",
             "--input_sentence_size=0", "--shuffle_input_sentence=false", "--num_threads=2", "--minloglevel=1"]
# Strings beyond the corpus whose ids are recorded (not required to agree: the held-out and
# validation texts are the check); phase 2 compares qshard's tokenizer on them.
EXTRA_STRINGS = ["In the beginning God created the heaven and the earth.", "Grüße 🦙", "  two  spaces ",
                 "line one\nline two\n\n", "Psalm 119:105 and 3.14159", "tab\there", ""]


def train(data_dir=corpus.DATA):
    text = corpus.load("train", data_dir)
    lines = [ln for ln in text.split("\n") if ln]
    with tempfile.TemporaryDirectory(prefix="qshard-spm-") as tmp:
        with open(os.path.join(tmp, "train.txt"), "w", encoding="ascii") as f:
            f.write("\n".join(lines) + "\n")
        cmd = ["spm_train", "--input=train.txt", "--model_prefix=tokenizer"] + SPM_FLAGS
        try:
            subprocess.run(cmd, cwd=tmp, check=True)
        except FileNotFoundError:
            raise corpus.CorpusError("spm_train is missing: apt-get install -y sentencepiece")
        raw = open(os.path.join(tmp, "tokenizer.model"), "rb").read()
    write_bytes_atomic(os.path.join(data_dir, "tokenizer.model"), raw)
    sums = corpus.read_sums(data_dir)
    sums["tokenizer.model"] = corpus.sha256(raw)
    corpus.write_sums(sums, data_dir)
    print("tokenizer.model %d bytes sha256 %s (%d training lines)" % (len(raw), corpus.sha256(raw)[:16], len(lines)))


def load_sp(path=TOKENIZER):
    """sentencepiece processor of tokenizer.model at path (sha256 checked against data/SHA256SUMS)."""
    import sentencepiece as spm
    raw = open(path, "rb").read()
    want = corpus.read_sums().get("tokenizer.model")   # copies are checked against the committed sum
    if corpus.sha256(raw) != want:
        raise CheckFailed("%s: sha256 %s does not match SHA256SUMS (%s)" % (path, corpus.sha256(raw), want))
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(raw)
    if sp.get_piece_size() != VOCAB or (sp.unk_id(), sp.bos_id(), sp.eos_id()) != (0, 1, 2):
        raise CheckFailed("tokenizer.model: %d pieces, unk/bos/eos %s" % (
            sp.get_piece_size(), (sp.unk_id(), sp.bos_id(), sp.eos_id())))
    return sp


def write_hf_files(d, model_max_length):
    """tokenizer.model, tokenizer_config.json and special_tokens_map.json as a Llama-2 checkpoint
    has them (the keys of meta-llama/Llama-2-7b-hf's tokenizer_config.json, tokens as strings)."""
    shutil.copyfile(TOKENIZER, os.path.join(d, "tokenizer.model"))
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "clean_up_tokenization_spaces": False,
           "eos_token": "</s>", "legacy": False, "model_max_length": model_max_length, "pad_token": None,
           "padding_side": "right", "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>"}
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    for name, obj in (("tokenizer_config.json", cfg), ("special_tokens_map.json", special)):
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
    return ["tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"]


def spm_tokenizer_json(sp):
    """Our own tokenizer.json of a SentencePiece BPE model, in the form transformers 5's
    LlamaTokenizer gives Llama-2 (tokenizers serialisation 1.0): BPE with byte_fallback and
    fuse_unk, no normalizer, Metaspace pre-tokenizer (prepend "▁" to the first word only, no
    split), BOS template post-processor, Replace/ByteFallback/Fuse/Strip decoder. Merges: every
    split of a normal piece into two pieces of the vocabulary, ordered by the merged piece's score
    (highest first), then by the ids of the parts - the order of transformers'
    SentencePieceExtractor. Used when transformers' conversion is unavailable or disagrees, and in
    the CPU dry run (checked there by `qshard tokenize`)."""
    n = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    merges = []
    for i in range(n):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i):
            continue
        piece = sp.id_to_piece(i)
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges += [(-sp.get_score(i), i, m) for m in local]
    merges.sort(key=lambda t: (t[0], t[1]))
    special = [{"id": i, "content": sp.id_to_piece(i), "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for i in (sp.unk_id(), sp.bos_id(), sp.eos_id())]
    bos = sp.id_to_piece(sp.bos_id())
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {bos: {"id": bos, "ids": [sp.bos_id()], "tokens": [bos]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": sp.id_to_piece(sp.unk_id()),
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False, "vocab": vocab,
                  "merges": [list(m) for _, _, m in merges]},
    }


def write_own_tokenizer_json(d):
    sp = load_sp(os.path.join(d, "tokenizer.model"))
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(spm_tokenizer_json(sp), f, ensure_ascii=False, indent=1)
        f.write("\n")


def _hf_convert(transformers, dst):
    """transformers' SentencePiece -> fast conversion of dst's tokenizer.model (with its configs
    only) -> dst/tokenizer.json. transformers 4.x: LlamaTokenizerFast(from_slow) runs
    LlamaConverter; 5.x: LlamaTokenizer is the tokenizers-backed class (LlamaTokenizerFast an
    alias) and converts the .model itself. Returns the class used."""
    cls = getattr(transformers, "LlamaTokenizerFast", None) or transformers.LlamaTokenizer
    with tempfile.TemporaryDirectory(prefix="qshard-tok-") as tmp:
        src, out = os.path.join(tmp, "src"), os.path.join(tmp, "out")
        os.makedirs(src)
        for fn in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copyfile(os.path.join(dst, fn), os.path.join(src, fn))
        try:
            tok = cls.from_pretrained(src, legacy=False, from_slow=True)
        except TypeError:
            tok = cls.from_pretrained(src, legacy=False)
        name = "%s.%s" % (type(tok).__module__, type(tok).__name__)
        tok.save_pretrained(out)
        if not os.path.exists(os.path.join(out, "tokenizer.json")):
            raise CheckFailed("%s.save_pretrained wrote no tokenizer.json (%s)" % (name, sorted(os.listdir(out))))
        shutil.copyfile(os.path.join(out, "tokenizer.json"), os.path.join(dst, "tokenizer.json"))
    return name


def check_ids(transformers, d, texts):
    """Ids (with BOS) of every text under the sentencepiece library on tokenizer.model (the "slow"
    reference: transformers 5 has no sentencepiece-backed Llama class), AutoTokenizer on d (the
    fast tokenizer golden users load) and the `tokenizers` library on d/tokenizer.json must be
    identical. Raises CheckFailed; returns the report."""
    import tokenizers
    sp = load_sp(os.path.join(d, "tokenizer.model"))
    auto = transformers.AutoTokenizer.from_pretrained(d)
    tk = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    rep = {"auto_class": "%s.%s" % (type(auto).__module__, type(auto).__name__), "checked": {}, "extra": []}

    def ids_all(t):
        return {"sentencepiece": [1] + sp.encode(t), "hf_auto": list(auto(t)["input_ids"]),
                "tokenizers_lib": tk.encode(t).ids}

    for name, t in texts.items():
        got = ids_all(t)
        ref = got["sentencepiece"]
        for k, v in got.items():
            if v != ref:
                i = next((j for j, (x, y) in enumerate(zip(ref, v)) if x != y), min(len(ref), len(v)))
                raise CheckFailed("tokenizer ids differ on %s: %s vs sentencepiece at index %d (%s vs %s)" % (
                    name, k, i, v[i:i + 5], ref[i:i + 5]))
        dec = auto.decode(ref, skip_special_tokens=True)
        rep["checked"][name] = {"tokens": len(ref), "decode_roundtrip": dec == t}
        log("  tokenizer %s: %d tokens identical in sentencepiece / AutoTokenizer / tokenizers; decode round "
            "trip %s" % (name, len(ref), dec == t))
    for t in EXTRA_STRINGS:
        got = ids_all(t)
        rep["extra"].append({"text": t, "ids": got, "agree": all(v == got["sentencepiece"] for v in got.values())})
    log("  extra strings agreeing: %d of %d" % (sum(e["agree"] for e in rep["extra"]), len(rep["extra"])))
    return rep


def make_tokenizer_json(transformers, d, texts):
    """d/tokenizer.json by transformers' conversion, checked with check_ids; if the conversion
    fails or its ids disagree, our spm_tokenizer_json() is tried (and must pass). The report says
    which one d holds and why."""
    import tokenizers
    rep = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
           "sentencepiece": _sp_version(), "attempts": []}
    for source in ("transformers", "ours"):
        try:
            if source == "transformers":
                rep["converter"] = _hf_convert(transformers, d)
            else:
                write_own_tokenizer_json(d)
            rep.update(check_ids(transformers, d, texts))
            rep["source"] = source
            own = spm_tokenizer_json(load_sp(os.path.join(d, "tokenizer.model")))
            with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
                m = json.load(f)["model"]
            rep["same_vocab_and_merges_as_ours"] = (m["vocab"] == own["model"]["vocab"] and
                                                    [list(x.split(" ")) if isinstance(x, str) else list(x)
                                                     for x in m["merges"]] == own["model"]["merges"])
            log("  tokenizer.json from %s (vocab and merges %s ours)" % (
                source, "equal to" if rep["same_vocab_and_merges_as_ours"] else "differ from"))
            return rep
        except Exception as e:  # noqa: BLE001 - recorded; the next source is tried
            rep["attempts"].append({"source": source, "error": "%s: %s" % (type(e).__name__, e)})
            log("  tokenizer.json from %s FAILED: %s: %s" % (source, type(e).__name__, e))
    raise CheckFailed("no tokenizer.json passed the ids check: %s" % rep["attempts"])


def _sp_version():
    import sentencepiece
    return getattr(sentencepiece, "__version__", "?")


def main(argv):
    if len(argv) != 2 or argv[1] != "train":
        print("usage: python3 tools/train/tokenizer.py train", file=sys.stderr)
        return 1
    try:
        train()
    except (corpus.CorpusError, subprocess.CalledProcessError) as e:
        print("tokenizer.py: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
