"""The transformers side of the pipeline (GPU machine: torch 2.11, transformers 5.x; 4.x works).

Conventions are golden.py's (tools/fixtures): fp32, attn_implementation "eager", TF32 off,
weights loaded through transformers' own from_pretrained, no missing / unexpected / mismatched
keys; quantized models are decoded with the independent reader and dequantized in fp32.
"""
import os

import numpy as np

import golden as GD   # tools/fixtures
from util import check, log


def setup(torch):
    """True fp32 matmuls for every fp32 computation (bf16 autocast training is unaffected)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def _from_pretrained(torch, transformers, d):
    kw = dict(attn_implementation="eager", output_loading_info=True)
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **kw)
    except TypeError:
        return transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, **kw)


def load_float(torch, transformers, d, sd16, device):
    """The float checkpoint directory as transformers loads it; every parameter must equal ours."""
    model, info = _from_pretrained(torch, transformers, d)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys",
                                                 "error_msgs") and v}
    check(not bad, "transformers could not load %s cleanly: %r" % (d, bad))
    msd = model.state_dict()
    for k, v in sd16.items():
        check(k in msd, "transformers has no parameter %s" % k)
        check(np.array_equal(msd[k].detach().float().cpu().numpy().view(np.uint32), v.view(np.uint32)),
              "transformers' %s differs from the exported weights" % k)
    check(type(model).__name__ == "LlamaForCausalLM", "loaded as %s" % type(model).__name__)
    return model.to(device).eval()


def load_dequant(torch, transformers, cfg_json, sd, tmp, device):
    """A dequantized fp32 state dict through golden.hf_load (saved, then from_pretrained)."""
    model, _info, match = GD.hf_load(torch, transformers, cfg_json, sd, tmp)
    check(match["matched_exactly"] == len(sd), "HF load matched %d of %d tensors" % (match["matched_exactly"], len(sd)))
    return model.to(device).eval()


def logits_fn(model, device):
    def fn(c):
        return model(c.to(device)).logits.float()
    return fn


def compare(torch, fn_a, fn_b, ids):
    """max |a - b| and relative L2 of two models' logits on ids [B, T]."""
    with torch.no_grad():
        a, b = fn_a(ids).double(), fn_b(ids).double()
    return float((a - b).abs().max()), float((a - b).norm() / a.norm())


def goldens(torch, transformers, name, dirs, prompts, device, out_root, tmp):
    """golden.py's golden group for the AWQ twins (dirs: GEMM first): decode + twin identity,
    transformers load, logits / 16-step greedy / seq_logits per text prompt, numpy reference
    cross-check. Writes out_root/name/ and returns golden.json's dict."""
    members = [{"name": os.path.basename(d), "path": os.path.abspath(d), "tokenizer": True,
                "prompts": [{"name": "text_%d" % (i + 1), "text": t} for i, t in enumerate(prompts)]}
               for d in dirs]
    gold = GD.run_group(torch, transformers, name, members, device, out_root, tmp)
    for p in gold["prompts"]:
        check(p["ref_greedy_equal"] and p["ref_rel_l2"] < 1e-4,
              "numpy reference disagrees with transformers on %s (rel %.2e)" % (p["name"], p["ref_rel_l2"]))
        log("  golden %s: %r -> %r (min margin %.3f)" % (p["name"], p.get("text"), p.get("greedy_text"),
                                                        min(p["greedy_margins"])))
    return gold
