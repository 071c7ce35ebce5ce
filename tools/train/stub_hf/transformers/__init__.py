"""Stand-in for transformers (see ../README.md): AutoModelForCausalLM / AutoTokenizer /
LlamaTokenizer(Fast) with the calls run_all.py and tools/fixtures/golden.py make."""
import json
import os
import shutil

import sentencepiece
import torch

import awq_unpack as AU
import model as M
import pack as P
import tokenizer as TK

__version__ = "stub"


class _Config:
    def __init__(self, d):
        self.d = d

    def to_dict(self):
        return dict(self.d)


class _Out:
    def __init__(self, logits):
        self.logits = logits


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = _Config(cfg)
        self.inner = M.LlamaLM(P.config_from_hf(cfg))

    def forward(self, ids):
        return _Out(self.inner(ids))

    def state_dict(self, *a, **k):
        return {k2: v for k2, v in self.inner.state_dict().items()}


class AutoModelForCausalLM:
    @staticmethod
    def from_pretrained(d, dtype=None, attn_implementation=None, output_loading_info=False, **kw):
        assert dtype is torch.float32 and attn_implementation == "eager"
        cfg = json.load(open(os.path.join(d, "config.json")))
        assert "quantization_config" not in cfg
        m = LlamaForCausalLM(cfg)
        sd = {k: t.f32() for k, t in AU.read_weights(d)[0].items()}
        m.inner.load_hf_state_dict(sd)
        info = {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
        return (m, info) if output_loading_info else m


class _Tok:
    def __init__(self, d):
        self.d = d
        self.sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))

    def __call__(self, text):
        return {"input_ids": [self.sp.bos_id()] + self.sp.encode(text)}

    def decode(self, ids, skip_special_tokens=False):
        return self.sp.decode([i for i in ids if not (skip_special_tokens and i < 3)])

    def save_pretrained(self, out):
        os.makedirs(out, exist_ok=True)
        shutil.copyfile(os.path.join(self.d, "tokenizer.model"), os.path.join(out, "tokenizer.model"))
        TK.write_own_tokenizer_json(out)


class AutoTokenizer:
    @staticmethod
    def from_pretrained(d, **kw):
        return _Tok(d)


class LlamaTokenizer(AutoTokenizer):
    pass


LlamaTokenizerFast = LlamaTokenizer
