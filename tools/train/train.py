#!/usr/bin/env python3
"""Training of the demo LLaMA (model.py) on the KJV training split (torch 1.13 CPU .. 2.x CUDA).

Recipe (defaults in TRAIN_DEFAULTS; run_all.py passes them): fixed seed; every sample is BOS
followed by seq_len - 1 tokens from a uniformly random offset of the training token stream (the
same shape as a `qshard perplexity` chunk, whose first token is replaced by BOS); AdamW
(beta1 0.9, beta2 0.95, weight decay on matrices and the embedding only), linear warm-up then
cosine decay to lr_min, gradient clipping at 1.0, residual dropout; bf16 autocast on CUDA (fp32
master weights), fp32 on the CPU. Every eval_every steps the validation perplexity (Hebrews, the
qshard protocol at ctx seq_len) is measured and the weights with the lowest one are kept (early
stopping); a greedy sample is logged. A wall-clock budget (train_seconds) shortens the cosine
schedule after the first steps if the planned steps would not fit, and stops at the budget in
any case, so the whole GPU command keeps to its time limit.

Standalone: python3 tools/train/train.py --bench [--device cpu]  measures steps/s of the real
configuration (for extrapolating the GPU time); run_all.py does the real training.
"""
import argparse
import contextlib
import copy
import math
import time

import torch

import evaluate as EV
import model as M
from util import log

MODEL_DEMO = {  # the committed demo model (AWQ GEMM + GEMV twin together ~20 MB)
    "vocab_size": 4096, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 5,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2}
MODEL_TINY = dict(MODEL_DEMO, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)

TRAIN_DEFAULTS = {"seed": 1234, "seq_len": 512, "batch": 32, "steps": 1200, "warmup": 100, "lr": 1e-3,
                  "lr_min": 1e-4, "weight_decay": 0.1, "dropout": 0.2, "grad_clip": 1.0,
                  "log_every": 25, "eval_every": 50, "train_seconds": 210.0, "plan_after": 30}
TRAIN_TINY = dict(TRAIN_DEFAULTS, seq_len=128, batch=8, steps=40, warmup=5, lr=3e-3, lr_min=3e-4,
                  dropout=0.0, log_every=5, eval_every=20, train_seconds=120.0, plan_after=20)
SAMPLE_PROMPT = "And God said"


def n_params(model):
    """(all parameters, parameters of the quantized linears) - tied lm_head counted once."""
    total = sum(p.numel() for p in model.parameters())
    lin = sum(p.numel() for n, p in model.named_parameters() if n.endswith("_proj.weight"))
    return total, lin


def flops_per_token(c, seq_len):
    """Training FLOPs per token: 6 * (matmul parameters incl. lm_head) + 12 * layers * hidden * T
    (attention scores and weighted sum, forward + backward; PaLM appendix B)."""
    h, i, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    mat = L * (2 * h * h + 2 * h * kv + 3 * h * i) + V * h
    return 6 * mat + 12 * L * h * seq_len


def autocast(on_cuda):
    """bf16 autocast on CUDA; nothing on the CPU (torch 1.13 CPU builds cannot even build a CUDA
    autocast context)."""
    return torch.autocast(device_type="cuda", dtype=torch.bfloat16) if on_cuda else contextlib.nullcontext()


def lr_at(step, tc, total):
    if step < tc["warmup"]:
        return tc["lr"] * (step + 1) / tc["warmup"]
    p = min(1.0, (step - tc["warmup"]) / max(1, total - tc["warmup"]))
    return tc["lr_min"] + 0.5 * (tc["lr"] - tc["lr_min"]) * (1 + math.cos(math.pi * p))


def optimizer(model, tc):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": tc["weight_decay"]},
                              {"params": other, "weight_decay": 0.0}], lr=tc["lr"], betas=(0.9, 0.95), eps=1e-8)


class Batches:
    """Random training windows [BOS, t_s .. t_{s+T-2}] -> targets [t_s .. t_{s+T-1}]."""

    def __init__(self, ids, seq_len, batch, bos, seed, device):
        self.ids = torch.tensor(ids, dtype=torch.int64)
        self.T, self.B, self.bos, self.device = seq_len, batch, bos, device
        self.g = torch.Generator().manual_seed(seed)
        if len(ids) < seq_len + 1:
            raise ValueError("training text has %d tokens, fewer than seq_len %d" % (len(ids), seq_len))

    def next(self):
        s = torch.randint(0, len(self.ids) - self.T + 1, (self.B,), generator=self.g)
        win = torch.stack([self.ids[i:i + self.T] for i in s.tolist()])
        x = torch.cat([torch.full((self.B, 1), self.bos, dtype=torch.int64), win[:, :-1]], dim=1)
        return x.to(self.device, non_blocking=True), win.to(self.device, non_blocking=True)


def sample(model, sp, device, steps=32):
    ids = sp.encode(SAMPLE_PROMPT)
    toks, _ = EV.greedy(model, [model.config["bos_token_id"]] + ids, steps, device)
    return sp.decode(ids + toks)


def valid_ppl(model, valid_ids, tc, device):
    def fn(c):
        return model(c.to(device)).float()
    bos = model.config["bos_token_id"]
    return EV.evaluate({"m": fn}, [bos] + valid_ids, tc["seq_len"], bos, batch=16)["m"]["ppl"]


def evaluate_step(model, valid_ids, tc, sp, device, step, t0, rep, best):
    """Validation perplexity and a sample at this step; returns the (ppl, step, weights) best."""
    model.eval()
    v = valid_ppl(model, valid_ids, tc, device)
    rep["evals"].append({"step": step, "valid_ppl": round(v, 4), "t": round(time.time() - t0, 1)})
    s = sample(model, sp, device)
    rep["samples"].append({"step": step, "text": s})
    log("eval step %d: valid ppl %.3f%s | %s" % (step, v, " (best)" if v < best[0] else "", s))
    return (v, step, copy.deepcopy(model.state_dict())) if v < best[0] else best


def train(cfg, tc, train_ids, valid_ids, sp, device):
    """Train a fresh LlamaLM; returns (model with the best validation weights, in eval mode and
    fp32, report dict with the loss curve, evaluations, timings and throughput)."""
    torch.manual_seed(tc["seed"])
    model = M.LlamaLM(cfg, dropout=tc["dropout"])
    model.init_weights(tc["seed"])
    model.to(device)
    on_cuda = str(device).startswith("cuda")
    model.set_sdpa(on_cuda)
    opt = optimizer(model, tc)
    data = Batches(train_ids, tc["seq_len"], tc["batch"], cfg["bos_token_id"], tc["seed"] + 1, device)
    total, lin = n_params(model)
    tok_step = tc["seq_len"] * tc["batch"]
    fpt = flops_per_token(cfg, tc["seq_len"])
    log("model: %.2fM parameters (%.2fM in quantized linears); %d tokens/step; %.1f MFLOP/token; "
        "train tokens %d (%.1f steps/epoch)" % (total / 1e6, lin / 1e6, tok_step, fpt / 1e6, len(train_ids),
                                               len(train_ids) / tok_step))
    steps = tc["steps"]
    rep = {"config": cfg, "train": tc, "params": total, "params_quantized_linears": lin, "tokens_per_step": tok_step,
           "flops_per_token": fpt, "train_tokens": len(train_ids), "curve": [], "evals": [], "samples": []}
    best = (float("inf"), -1, None)
    t0 = time.time()
    run_loss, run_n, step = 0.0, 0, 0
    while step < steps:
        lr = lr_at(step, tc, steps)
        for g in opt.param_groups:
            g["lr"] = lr
        model.train()
        x, y = data.next()
        with autocast(on_cuda):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc["grad_clip"])
        opt.step()
        step += 1
        run_loss = run_loss + loss.detach()      # a tensor: no GPU sync per step
        run_n += 1
        if on_cuda and step in (10, tc["plan_after"]):
            torch.cuda.synchronize()             # honest step times for the plan
        el = time.time() - t0
        if step == 10:
            t10 = el      # the first steps include CUDA start-up: time steps 11 .. plan_after
        if step == tc["plan_after"] and 10 < step < steps:
            per = (el - t10) / (step - 10)
            fit = int((tc["train_seconds"] * 0.85) / per)
            log("step time %.1f ms (%.0f tokens/s, %.1f TFLOP/s): %d steps take ~%.0f s" % (
                per * 1e3, tok_step / per, fpt * tok_step / per / 1e12, steps, per * steps))
            if fit < steps:
                log("  budget %.0f s: schedule shortened to %d steps" % (tc["train_seconds"], fit))
                steps = max(fit, step + 1)
        if step % tc["log_every"] == 0 or step == steps:
            mean = float(run_loss) / run_n
            rep["curve"].append({"step": step, "loss": round(mean, 4), "lr": lr, "t": round(el, 1)})
            log("step %5d/%d loss %.4f lr %.2e  %.0f tok/s  %.0f s" % (step, steps, mean, lr, step * tok_step / el, el))
            run_loss, run_n = 0.0, 0
        last = step == steps or time.time() - t0 > tc["train_seconds"]
        if step % tc["eval_every"] == 0 or last:
            best = evaluate_step(model, valid_ids, tc, sp, device, step, t0, rep, best)
        if last and step < steps:
            log("time budget %.0f s reached at step %d of %d" % (tc["train_seconds"], step, steps))
            break
    dt = time.time() - t0
    model.load_state_dict(best[2])
    model.set_sdpa(False)
    model.eval()
    rep.update({"steps_done": step, "steps_planned": steps, "best_step": best[1], "best_valid_ppl": best[0],
                "seconds": round(dt, 1), "tokens_per_s": round(step * tok_step / dt),
                "achieved_tflops": round(fpt * tok_step * step / dt / 1e12, 2)})
    log("training: %d steps in %.1f s (%.0f tok/s, %.2f TFLOP/s); best valid ppl %.3f at step %d" % (
        step, dt, rep["tokens_per_s"], rep["achieved_tflops"], best[0], best[1]))
    return model, rep


def bench(device, steps, batch):
    """Steps/s of the demo configuration with random tokens (no data, no eval)."""
    cfg = MODEL_DEMO
    tc = dict(TRAIN_DEFAULTS, batch=batch)
    model = M.LlamaLM(cfg, dropout=tc["dropout"]).to(device)
    model.init_weights(1)
    on_cuda = str(device).startswith("cuda")
    model.set_sdpa(on_cuda)
    opt = optimizer(model, tc)
    x = torch.randint(0, cfg["vocab_size"], (batch, tc["seq_len"]), device=device)
    fpt = flops_per_token(cfg, tc["seq_len"])
    for i in range(steps + 1):
        if i == 1:
            t0 = time.time()
        with autocast(on_cuda):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), x.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if on_cuda:
            torch.cuda.synchronize()
    per = (time.time() - t0) / steps
    tok = batch * tc["seq_len"]
    print("demo config, batch %d x %d: %.3f s/step, %.0f tokens/s, %.3f TFLOP/s (%.1f MFLOP/token)" % (
        batch, tc["seq_len"], per, tok / per, fpt * tok / per / 1e12, fpt / 1e6))
    print("full recipe (%d steps x %d tokens = %.1f PFLOP)" % (
        TRAIN_DEFAULTS["steps"], TRAIN_DEFAULTS["batch"] * tc["seq_len"],
        fpt * TRAIN_DEFAULTS["steps"] * TRAIN_DEFAULTS["batch"] * tc["seq_len"] / 1e15))


def main():
    ap = argparse.ArgumentParser(description="see the module docstring; run_all.py runs the training")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    if not a.bench:
        ap.error("only --bench runs standalone; the training is a stage of run_all.py")
    bench(a.device, a.steps, a.batch)


if __name__ == "__main__":
    main()
