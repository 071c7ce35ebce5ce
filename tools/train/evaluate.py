"""Perplexity with exactly the chunking of `qshard perplexity`, model-to-model agreement, and greedy
continuations, for any model given as a function ids [B, T] (torch int64) -> logits [B, T, V].

Perplexity protocol (runtime/rt_main.c cmd_perplexity, after llama.cpp's perplexity()): the whole
text is tokenized once with BOS first; it is cut into n = len(ids) // ctx non-overlapping chunks
of ctx tokens (the rest is dropped); each chunk is evaluated from an empty cache with its first
token replaced by BOS; the negative log-likelihood of token j+1 from the logits at j is summed for
j = ctx/2 .. ctx-2 (ctx - 1 - ctx/2 tokens per chunk); ppl = exp(sum / count). Log-softmax is
computed in float64 from the float32 logits, as qshard does. `running` holds the estimate after
each chunk, i.e. what `qshard perplexity --chunks k` prints as its final value.
"""
import math

import numpy as np
import torch


def chunks_of(ids, ctx, bos):
    """ids (list, BOS first) -> int64 tensor [n, ctx] with column 0 set to bos."""
    n = len(ids) // ctx
    if n == 0:
        raise ValueError("%d tokens: fewer than one chunk of %d" % (len(ids), ctx))
    c = torch.tensor(ids[:n * ctx], dtype=torch.int64).view(n, ctx).clone()
    c[:, 0] = bos
    return c


def _scored_logprobs(logits, chunk, first):
    """float64 log-softmax rows first..ctx-2 and the log-prob of each next token."""
    lp = torch.log_softmax(logits[:, first:-1].double(), dim=-1)
    tgt = chunk[:, first + 1:].to(lp.device)
    return lp, lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)


def evaluate(fns, ids, ctx, bos, batch=8, ref=None, max_chunks=None):
    """Perplexity of each model in fns (name -> logits function) on ids; with ref (a name in fns)
    also the mean KL(ref || model) and the top-1 agreement with ref over the scored positions.

    Returns {name: {"ppl", "nll_sum", "count", "chunks", "running", "stderr"[, "kl_to_ref",
    "top1_agree_ref"]}}; stderr = ppl * std(nll) / sqrt(count - 1) as qshard prints it."""
    chunks = chunks_of(ids, ctx, bos)
    if max_chunks:
        chunks = chunks[:max_chunks]
    first = ctx // 2
    acc = {k: {"nll": [], "kl": 0.0, "agree": 0} for k in fns}
    with torch.no_grad():
        for b in range(0, chunks.shape[0], batch):
            c = chunks[b:b + batch]
            outs = {}
            for name, fn in fns.items():
                lp, tok = _scored_logprobs(fn(c), c, first)
                acc[name]["nll"].append((-tok).cpu())
                outs[name] = lp
            if ref is not None:
                r = outs[ref]
                for name, lp in outs.items():
                    acc[name]["kl"] += float((r.exp() * (r - lp)).sum())
                    acc[name]["agree"] += int((r.argmax(-1) == lp.argmax(-1)).sum())
    res = {}
    for name, a in acc.items():
        nll = torch.cat(a["nll"]).double()              # [n, ctx - 1 - first]
        flat = nll.reshape(-1)
        count = flat.numel()
        mean = float(flat.mean())
        ppl = math.exp(mean)
        var = float((flat * flat).mean()) - mean * mean
        running = (nll.sum(1).cumsum(0) / torch.arange(1, nll.shape[0] + 1) / nll.shape[1]).exp()
        r = {"ppl": ppl, "nll_sum": float(flat.sum()), "count": count, "chunks": int(nll.shape[0]),
             "running": [round(float(x), 6) for x in running],
             "stderr": ppl * math.sqrt(var / (count - 1)) if count > 1 and var > 0 else 0.0}
        if ref is not None:
            r["kl_to_ref"] = a["kl"] / count
            r["top1_agree_ref"] = a["agree"] / count
        res[name] = r
    return res


def greedy(fn, ids, steps, device):
    """steps argmax tokens after ids, each step a full re-forward (no KV cache, no stop at eos);
    ties go to the lowest id. Returns (tokens, top1 - top2 margins)."""
    seq = list(ids)
    out, margins = [], []
    with torch.no_grad():
        for _ in range(steps):
            last = fn(torch.tensor([seq], dtype=torch.int64, device=device))[0, -1].float().cpu().numpy()
            order = np.argsort(-last, kind="stable")
            out.append(int(order[0]))
            margins.append(float(last[order[0]] - last[order[1]]))
            seq.append(int(order[0]))
    return out, margins
