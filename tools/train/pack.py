"""Checkpoint directories of the demo model, written with the fixture packers and writers
(tools/fixtures/awq_pack.py, gen_fixtures.py's config writers) and read back with the independent
reader (tools/fixtures/awq_unpack.py).

    float checkpoint   config.json (no quantization_config), model.safetensors (all F16)
    AWQ checkpoint     config.json with quantization_config as AutoAWQ writes it
                       {bits 4, group_size 128, modules_to_not_convert null, quant_method "awq",
                       version "gemm" | "gemv", zero_point true}; model.safetensors with
                       qweight/qzeros/scales per linear in that layout, F16 embedding and norms
Both: generation_config.json (Llama-2's, max_length = context) and the tokenizer files.
"""
import os
import shutil

import numpy as np

import awq_pack as AP     # tools/fixtures
import awq_unpack as AU   # tools/fixtures
import gen_fixtures as GF  # tools/fixtures
from util import check

LINEAR_ORDER = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def spec_of(cfg, variant="gemm", group_size=128):
    """Our config -> the fixture spec that gen_fixtures.hf_config / quant_config_block read."""
    return {"arch": "llama", "bos": cfg["bos_token_id"], "eos": cfg["eos_token_id"], "hidden": cfg["hidden_size"],
            "inter": cfg["intermediate_size"], "max_pos": cfg["max_position_embeddings"],
            "heads": cfg["num_attention_heads"], "kv_heads": cfg["num_key_value_heads"],
            "head_dim": cfg["head_dim"], "layers": cfg["num_hidden_layers"], "eps": cfg["rms_norm_eps"],
            "rope_theta": cfg["rope_theta"], "rope_scaling": None, "tie": cfg["tie_word_embeddings"],
            "float_dtype": "F16", "vocab": cfg["vocab_size"], "features": ["explicit_head_dim"],
            "variant": variant, "group_size": group_size, "modules_to_not_convert": None,
            "spelling": "config.json:quantization_config", "tokenizer": "llama2"}


def config_from_hf(c):
    """HF config.json dict -> our model config (model.CONFIG_KEYS)."""
    out = {k: c[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                             "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                             "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id")}
    out["head_dim"] = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return out


def _common_files(d, cfg, tok_dir, quant, group_size=128):
    s = spec_of(cfg, quant or "gemm", group_size)
    AP.write_json(os.path.join(d, "config.json"), GF._sorted(GF.hf_config(s, quant is not None)))
    gen = dict(GF.generation_config(s), max_length=cfg["max_position_embeddings"])
    AP.write_json(os.path.join(d, "generation_config.json"), GF._sorted(gen))
    for fn in sorted(os.listdir(tok_dir)):
        shutil.copyfile(os.path.join(tok_dir, fn), os.path.join(d, fn))


def _layer_names(cfg):
    for i in range(cfg["num_hidden_layers"]):
        yield i, "model.layers.%d." % i


def write_float(d, cfg, sd16, tok_dir):
    """Float checkpoint: sd16 {HF name: fp32 array holding fp16 values}."""
    os.makedirs(d, exist_ok=True)
    names = ["model.embed_tokens.weight"]
    for _, p in _layer_names(cfg):
        names += [p + n + ".weight" for n in LINEAR_ORDER]
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    check(set(names) == set(sd16), "float state dict names differ from the LLaMA layout")
    AP.write_safetensors(os.path.join(d, "model.safetensors"), [(n, AP.T("F16", sd16[n])) for n in names])
    _common_files(d, cfg, tok_dir, None)


def write_quantized(d, cfg, qm, variant, tok_dir):
    """AWQ-layout checkpoint (variant "gemm" or "gemv") of a quantized model (awq.finish())."""
    os.makedirs(d, exist_ok=True)
    tensors = [("model.embed_tokens.weight", AP.T("F16", qm["floats"]["model.embed_tokens.weight"]))]
    for _, p in _layer_names(cfg):
        for n in LINEAR_ORDER:
            q, z, s = qm["linears"][p + n]
            for suf, t in AP.pack_linear(variant, q, z, s, qm["group_size"]).items():
                tensors.append((p + n + "." + suf, t))
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            tensors.append((p + n, AP.T("F16", qm["floats"][p + n])))
    tensors.append(("model.norm.weight", AP.T("F16", qm["floats"]["model.norm.weight"])))
    AP.write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    _common_files(d, cfg, tok_dir, variant, qm["group_size"])


def verify_quantized(d, qm, variant):
    """Read d back with awq_unpack: every q, z, s and float tensor bit-exact, each linear detected
    as `variant`. Returns the decoded fp32 state dict (what the goldens use)."""
    r = AU.load_model_dir(d)
    check(r["quant"]["group_size"] == qm["group_size"] and r["quant"]["bits"] == 4, "%s: quant config" % d)
    check(set(r["linears"]) == set(qm["linears"]), "%s: linears differ" % d)
    for p, (q, z, s) in qm["linears"].items():
        v2, q2, z2, s2, b2 = r["linears"][p]
        check(v2 == variant and b2 is None, "%s: %s decoded as %s" % (d, p, v2))
        check(np.array_equal(q2, q) and np.array_equal(z2, z) and
              np.array_equal(s2.view(np.uint16), s.view(np.uint16)), "%s: %s does not round-trip" % (d, p))
    check(set(r["floats"]) == set(qm["floats"]), "%s: float tensors differ" % d)
    for n, a in qm["floats"].items():
        check(np.array_equal(r["floats"][n].f32().view(np.uint32), a.view(np.uint32)), "%s: %s differs" % (d, n))
    return AU.float_state_dict(r)


def du(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
