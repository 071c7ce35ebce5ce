"""AWQ and round-to-nearest 4-bit quantization of our LlamaLM (torch; our own code).

AWQ as Lin et al. define it ("AWQ: Activation-aware Weight Quantization for LLM Compression and
Acceleration", MLSys 2024, section 3): salient weight channels are those that see large
activations, and scaling an input channel up by s before quantization (and the activation down
by s) protects it. Per group of linears that share an input X (in each decoder layer, in order):

    qkv      q/k/v_proj   X = input_layernorm output      s folded into input_layernorm.weight
    o        o_proj       X = attention output (pre o)   s folded into v_proj's output rows
    gate/up  gate/up_proj X = post_attention_layernorm   s folded into that norm's weight
    down     down_proj    X = silu(gate) * up            s folded into up_proj's output rows

1. s_X = mean over the calibration tokens of |X| per input channel;
2. grid search of the exponent: for alpha in {0, 1/20, ..., 19/20}, s = s_X^alpha (clamped at
   1e-4, divided by sqrt(max(s) * min(s))), the linears are replaced by Q(W diag(s)) diag(s)^-1
   and the mean squared error of the block's output against the float block is measured (block:
   the whole attention for qkv, the whole MLP for gate/up, the linear itself for o and down);
   the best alpha wins (alpha = 0 is s = 1, plain rounding, so the search never does worse on
   the calibration set);
3. all scales of the layer are folded: W diag(s) for the linears, the preceding op divided by s,
   so the float model computes the same function (checked: layer output relative error < 1e-4);
4. clipping search (as in the authors' llm-awq code, auto_clip): per output row and group of 128
   inputs, the weights are clamped to [-m, m] with m = max|w| * (1 - i/20), i = 0..9, and the m
   that minimises the squared error of that group's partial products with 512 calibration tokens
   is kept; not for q_proj and k_proj (their error passes through the q.k product, which a
   per-linear measure does not see), as llm-awq does;
5. group-128 asymmetric 4-bit with zero points, AutoAWQ's pseudo-quantize math
   (tools/fixtures/awq_quant.py: s = (max - min) / 15 stored as fp16, z = clamp(-round(min / s),
   0, 15), q = clamp(round(w / s) + z, 0, 15); dequantized (q - z) * s).

o_proj under GQA: v_proj has n_kv_heads * head_dim output channels, o_proj n_heads * head_dim
input channels, so AutoAWQ and llm-awq skip this pair when the shapes differ. Every o_proj input
channel (head h, dim d) is however a convex combination (the attention weights) of v channel
(h // n_rep, d) alone, so dividing v's row by s and multiplying o's column by the same s is exact
if the n_rep query heads that share a kv head share the scale. We search such tied scales:
s_X of a v channel is the mean of s_X over the o channels it feeds.

Calibration: n_samples windows of seq_len tokens (BOS first, as in training) drawn with a fixed
seed from the training split only. The inputs of layer i + 1 are the float layer i outputs.
RTN: step 5 alone on the same float model.

Per-channel (group_size -1, as AutoAWQ's q_group_size -1): every function takes the group size;
with -1 a group is a whole input row of K channels (one scale and zero per output channel), the
clipping bound is searched per output row, and the checkpoint says group_size -1.
"""
import math

import numpy as np
import torch

import awq_quant as AQ   # tools/fixtures (util.py puts it on sys.path)
from util import check, log

GROUP = 128
N_GRID = 20
CLIP_STEPS = 10          # shrink factors 1.0, 0.95, ..., 0.55 (llm-awq max_shrink 0.5)
CLIP_TOKENS = 512
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def group_of(g, k):
    """Input channels per quantization group of a K-input linear: g, or K when g is -1."""
    return k if g == -1 else g


def fake_quant(w, g=GROUP):
    """Dequantized group-g 4-bit zero-point quantization of w [N, K] (fp32 torch; g -1: per
    channel): exactly awq_quant.quantize followed by dequantize (the fp16 rounding of the scale
    included)."""
    n, k = w.shape
    g = group_of(g, k)
    wg = w.reshape(n, k // g, g)
    mx = wg.amax(-1, keepdim=True)
    mn = wg.amin(-1, keepdim=True)
    s = ((mx - mn).clamp(min=1e-5) / 15).half().float()
    z = (-torch.round(mn / s)).clamp(0, 15)
    q = (torch.round(wg / s) + z).clamp(0, 15)
    return ((q - z) * s).reshape(n, k)


def calibration(train_ids, n_samples, seq_len, bos, seed):
    """[n_samples, seq_len] int64: BOS + seq_len - 1 tokens from seeded random offsets."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor(train_ids, dtype=torch.int64)
    s = torch.randint(0, len(ids) - seq_len, (n_samples,), generator=g)
    win = torch.stack([ids[i:i + seq_len - 1] for i in s.tolist()])
    return torch.cat([torch.full((n_samples, 1), bos, dtype=torch.int64), win], dim=1)


def _chunked(fn, x, chunk):
    return torch.cat([fn(x[i:i + chunk]) for i in range(0, x.shape[0], chunk)])


def _mse(fn, x, ref, chunk):
    tot = 0.0
    for i in range(0, x.shape[0], chunk):
        tot += float((fn(x[i:i + chunk]) - ref[i:i + chunk]).double().pow(2).sum())
    return tot / ref.numel()


def capture(layer, x, cos, sin, chunk):
    """Float forward of one decoder layer on x [B, T, H]; returns the four group inputs and the
    layer output."""
    def run(xb):
        a = layer.input_layernorm(xb)
        o = layer.self_attn.heads(a, cos, sin)
        h = xb + layer.self_attn.o_proj(o)
        m = layer.post_attention_layernorm(h)
        d = layer.mlp.inner(m)
        return torch.cat([a, o, m, d, h + layer.mlp.down_proj(d)], dim=-1)
    with torch.no_grad():
        y = _chunked(run, x, chunk)
    sizes = [layer.input_layernorm.weight.numel(), layer.self_attn.o_proj.in_features,
             layer.post_attention_layernorm.weight.numel(), layer.mlp.down_proj.in_features, x.shape[-1]]
    return dict(zip(("qkv", "o", "gate_up", "down", "out"), torch.split(y, sizes, dim=-1)))


def search_scale(x, linears, block, x_mean, chunk, g):
    """Grid search of alpha for linears sharing input x; block(x) uses their current weights; g:
    group size. Returns (best scales [K], best alpha, errors per alpha)."""
    orig = [lin.weight.data.clone() for lin in linears]
    with torch.no_grad():
        ref = _chunked(block, x, chunk)
        errs, best = [], (math.inf, None, None)
        for i in range(N_GRID):
            alpha = i / N_GRID
            s = x_mean.pow(alpha).clamp(min=1e-4)
            s = s / (s.max() * s.min()).sqrt()
            for lin, w in zip(linears, orig):
                lin.weight.data = fake_quant(w * s, g) / s
            e = _mse(block, x, ref, chunk)
            errs.append(e)
            if e < best[0]:
                best = (e, alpha, s.clone())
        for lin, w in zip(linears, orig):
            lin.weight.data = w
    return best[2], best[1], errs


def search_clip(w, x, g):
    """Per (row, group) clipping bound [N, K / G, 1] of w [N, K] against calibration inputs
    x [tokens, K]; g: group size."""
    n, k = w.shape
    g = group_of(g, k)
    ng = k // g
    step = max(1, x.shape[0] // CLIP_TOKENS)
    xs = x[::step][:CLIP_TOKENS].reshape(-1, ng, g)
    wg = w.reshape(n, ng, g)
    org_max = wg.abs().amax(-1, keepdim=True)
    org = torch.einsum("tgk,ngk->ntg", xs, wg)
    best_err = torch.full((n, ng), math.inf, device=w.device, dtype=torch.float64)
    best_max = org_max.clone()
    for i in range(CLIP_STEPS):
        m = org_max * (1 - i / N_GRID)
        cw = torch.max(torch.min(wg, m), -m)
        qw = fake_quant(cw.reshape(n, k), g).reshape(n, ng, g)
        err = (torch.einsum("tgk,ngk->ntg", xs, qw) - org).double().pow(2).mean(1)
        better = err < best_err
        best_err[better] = err[better]
        best_max[better] = m[better]
    return best_max


def _fold(layer, scales):
    """Fold the four scale vectors into the layer (float function unchanged)."""
    a, o, gu, d = scales["qkv"], scales["o"], scales["gate_up"], scales["down"]
    at, mlp = layer.self_attn, layer.mlp
    rep = at.n_heads // at.n_kv
    s_v = o.view(at.n_kv, rep, at.hd)[:, 0, :].reshape(-1)
    with torch.no_grad():
        layer.input_layernorm.weight.div_(a)
        for lin in (at.q_proj, at.k_proj, at.v_proj):
            lin.weight.mul_(a)
        at.v_proj.weight.div_(s_v[:, None])
        at.o_proj.weight.mul_(o)
        layer.post_attention_layernorm.weight.div_(gu)
        mlp.gate_proj.weight.mul_(gu)
        mlp.up_proj.weight.mul_(gu)
        mlp.up_proj.weight.div_(d[:, None])
        mlp.down_proj.weight.mul_(d)


def _tied_o_mean(o_in, at):
    """mean |X| of o_proj's inputs, averaged over the query heads sharing a kv head, expanded."""
    rep = at.n_heads // at.n_kv
    m = o_in.abs().reshape(-1, at.n_heads * at.hd).mean(0).view(at.n_kv, rep, at.hd).mean(1, keepdim=True)
    return m.expand(at.n_kv, rep, at.hd).reshape(-1)


def awq_layer(layer, x, cos, sin, chunk, g):
    """AWQ steps 1-4 on one layer (in place), group size g. Returns (float output for the next
    layer, report)."""
    feats = capture(layer, x, cos, sin, chunk)
    at, mlp = layer.self_attn, layer.mlp
    groups = {
        "qkv": ([at.q_proj, at.k_proj, at.v_proj], lambda z: at(z, cos, sin)),
        "o": ([at.o_proj], at.o_proj),
        "gate_up": ([mlp.gate_proj, mlp.up_proj], mlp),
        "down": ([mlp.down_proj], mlp.down_proj),
    }
    scales, rep = {}, {}
    for name, (lins, block) in groups.items():
        xin = feats[name]
        xm = _tied_o_mean(xin, at) if name == "o" else xin.abs().reshape(-1, xin.shape[-1]).mean(0)
        s, alpha, errs = search_scale(xin, lins, block, xm, chunk, g)
        scales[name] = s
        rep[name] = {"alpha": alpha, "mse_best": errs[int(round(alpha * N_GRID))], "mse_rtn": errs[0]}
    _fold(layer, scales)
    for name in groups:
        feats[name] = feats[name] / scales[name]
    with torch.no_grad():
        y2 = capture(layer, x, cos, sin, chunk)["out"]
    rel = float((y2 - feats["out"]).norm() / feats["out"].norm())
    check(rel < 1e-4, "AWQ scale folding changed the float layer output (relative error %.2e)" % rel)
    rep["fold_rel_err"] = rel
    clipped = {}
    for name, lin, src in (("v_proj", at.v_proj, "qkv"), ("o_proj", at.o_proj, "o"),
                           ("gate_proj", mlp.gate_proj, "gate_up"), ("up_proj", mlp.up_proj, "gate_up"),
                           ("down_proj", mlp.down_proj, "down")):
        with torch.no_grad():
            xin = feats[src].reshape(-1, feats[src].shape[-1])
            w = lin.weight.data
            m = search_clip(w, xin, g)
            n, k = w.shape
            wg = w.view(n, -1, group_of(g, k))
            lin.weight.data = torch.max(torch.min(wg, m), -m).reshape(n, k)
            clipped[name] = round(float((m < wg.abs().amax(-1, keepdim=True)).float().mean()), 4)
    rep["clip_fraction_shrunk"] = clipped
    return feats["out"], rep


def finish(model, extra, g=GROUP):
    """Canonical quantized form of every linear (numpy, awq_quant.quantize, group size g) plus the
    float tensors rounded to fp16 (what the checkpoint stores), with the torch/numpy agreement
    check."""
    lin, flt = {}, {}
    for name, p in model.named_parameters():
        w = p.detach().float().cpu()
        if name == "lm_head.weight" and model.config["tie_word_embeddings"]:
            continue
        prefix = name[:-len(".weight")]
        if prefix.endswith(LINEARS):
            q, z, s = AQ.quantize(w.numpy(), g)
            deq = AQ.dequantize(q, z, s, g).T
            check(np.array_equal(deq, fake_quant(w, g).numpy()), "%s: torch fake_quant and awq_quant disagree" % name)
            lin[prefix] = (q, z, s)
        else:
            flt[name] = w.numpy().astype(np.float16).astype(np.float32)
    return {"linears": lin, "floats": flt, "group_size": g, "report": extra}


def awq(model, calib, device, chunk=16, g=GROUP):
    """AWQ-quantize a copy-safe float LlamaLM in place (fp32 on device), group size g (-1: per
    channel). Returns finish()."""
    model.to(device).eval()
    cos, sin = model.rope(calib.shape[1], device)
    with torch.no_grad():
        x = _chunked(lambda c: model.model.embed_tokens(c.to(device)), calib, chunk)
    layers = []
    for i, layer in enumerate(model.model.layers):
        x, rep = awq_layer(layer, x, cos, sin, chunk, g)
        layers.append(rep)
        log("  awq layer %d: alpha qkv %.2f o %.2f gate/up %.2f down %.2f; block mse / rtn mse: %s; "
            "fold rel err %.1e" % (i, rep["qkv"]["alpha"], rep["o"]["alpha"], rep["gate_up"]["alpha"],
                                   rep["down"]["alpha"], " ".join(
                                       "%.3f" % (rep[g]["mse_best"] / rep[g]["mse_rtn"]) if rep[g]["mse_rtn"] else "-"
                                       for g in ("qkv", "o", "gate_up", "down")), rep["fold_rel_err"]))
    return finish(model, {"layers": layers, "calib_shape": list(calib.shape), "n_grid": N_GRID,
                          "clip_steps": CLIP_STEPS, "clip_tokens": CLIP_TOKENS, "group_size": g}, g)


def rtn(model, g=GROUP):
    """Round-to-nearest of the same float model: finish() without scaling or clipping."""
    return finish(model, {"method": "rtn", "group_size": g}, g)


def dequant_state_dict(qm):
    """HF-named fp32 state dict of a finish() result ((q - z) * s in fp32)."""
    sd = {p + ".weight": np.ascontiguousarray(AQ.dequantize(q, z, s, qm["group_size"]).T)
          for p, (q, z, s) in qm["linears"].items()}
    sd.update(qm["floats"])
    return sd
