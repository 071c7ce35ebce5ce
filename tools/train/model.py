"""Our LLaMA in torch (runs on torch 1.13 CPU and torch 2.x CUDA): the model trained for the demo.

The math is that of HF transformers' LlamaForCausalLM (modeling_llama.py), which the GPU run checks
by loading the exported checkpoint there and comparing logits (run_all.py, stage "hf-check"):

    h = embed[ids]
    per layer:  a = rmsnorm(h) * input_layernorm;  h = h + o_proj(attn(q_proj a, k_proj a, v_proj a))
                m = rmsnorm(h) * post_attention_layernorm;  h = h + down_proj(silu(gate_proj m) * up_proj m)
    logits = lm_head(rmsnorm(h) * norm)            (lm_head tied to embed when tie_word_embeddings)

rmsnorm(x) = x / sqrt(mean(x^2) + eps) in fp32; RoPE of "rotate_half" form (the two halves of each
head are the pairs, inv_freq = theta^(-2i/d)); causal softmax attention scaled by 1/sqrt(head_dim);
GQA: kv head j serves query heads j*n_rep .. j*n_rep + n_rep - 1 (n_rep = n_heads / n_kv_heads).
Parameter names are HF's (model.layers.<i>.self_attn.q_proj.weight, ...), so state_dict() is an HF
state dict (lm_head.weight omitted when tied).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# Config keys (HF config.json spelling) that the model reads.
CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
               "tie_word_embeddings", "bos_token_id", "eos_token_id")


def check_config(c):
    """Shape rules of the demo model (qshard kernels and TP 1/2/4): raises ValueError."""
    for k in CONFIG_KEYS:
        if k not in c:
            raise ValueError("config lacks %s" % k)
    if c["num_attention_heads"] * c["head_dim"] != c["hidden_size"]:
        raise ValueError("num_attention_heads * head_dim != hidden_size")
    if c["num_attention_heads"] % c["num_key_value_heads"]:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    if c["hidden_size"] % 128 or c["intermediate_size"] % 128:
        raise ValueError("hidden_size and intermediate_size must be multiples of the group size 128")
    if c["head_dim"] % 2:
        raise ValueError("head_dim must be even (RoPE pairs)")


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(seq_len, head_dim, theta, device):
    """cos, sin [T, head_dim] in fp32: angle(t, i) = t * theta^(-2i/d), both halves equal."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        h = c["hidden_size"]
        self.q_proj = nn.Linear(h, self.n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.hd, h, bias=False)
        self.use_sdpa = False   # training on torch >= 2 (flash attention); eval keeps the plain path

    def heads(self, x, cos, sin):
        """x [B, T, H] -> attention output before o_proj [B, T, n_heads * head_dim]."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        cos, sin = cos[:t].to(q.dtype), sin[:t].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_heads // self.n_kv
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if self.use_sdpa and hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hd)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            s = s.masked_fill(mask, torch.finfo(s.dtype).min)
            p = torch.softmax(s.float(), dim=-1).to(q.dtype)
            y = torch.matmul(p, v)
        return y.transpose(1, 2).reshape(b, t, self.n_heads * self.hd)

    def forward(self, x, cos, sin):
        return self.o_proj(self.heads(x, cos, sin))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def inner(self, x):
        """The input of down_proj: silu(gate x) * up x."""
        return F.silu(self.gate_proj(x)) * self.up_proj(x)

    def forward(self, x):
        return self.down_proj(self.inner(x))


class Block(nn.Module):
    def __init__(self, c, dropout):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)
        self.drop = nn.Dropout(dropout)

    def forward(self, h, cos, sin):
        h = h + self.drop(self.self_attn(self.input_layernorm(h), cos, sin))
        return h + self.drop(self.mlp(self.post_attention_layernorm(h)))


class Inner(nn.Module):
    def __init__(self, c, dropout):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Block(c, dropout) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class LlamaLM(nn.Module):
    """LlamaForCausalLM-shaped module: self.model.{embed_tokens, layers, norm}, self.lm_head."""

    def __init__(self, config, dropout=0.0):
        super().__init__()
        check_config(config)
        self.config = dict(config)
        self.model = Inner(config, dropout)
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)
        if config["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._rope = None

    def init_weights(self, seed, std=0.02):
        """Normal(0, std) linears and embedding, output projections (o, down) scaled by
        1/sqrt(2 * n_layers) as in GPT-2; norms 1. Deterministic for a seed."""
        g = torch.Generator().manual_seed(seed)
        scale = 1.0 / math.sqrt(2 * self.config["num_hidden_layers"])
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("layernorm.weight") or name == "model.norm.weight":
                    p.fill_(1.0)
                else:
                    s = std * (scale if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0)
                    p.copy_(torch.randn(p.shape, generator=g) * s)

    def rope(self, t, device):
        c = self.config
        key = str(device)
        if self._rope is None or self._rope[0] != key or self._rope[1].shape[0] < t:
            n = max(t, c["max_position_embeddings"])
            self._rope = (key,) + rope_cos_sin(n, c["head_dim"], c["rope_theta"], device)
        return self._rope[1:]

    def hidden(self, ids):
        """ids [B, T] -> final hidden states (after model.norm) [B, T, H]."""
        cos, sin = self.rope(ids.shape[1], ids.device)
        h = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            h = layer(h, cos, sin)
        return self.model.norm(h)

    def forward(self, ids):
        """ids [B, T] int64 -> logits [B, T, vocab]."""
        return self.lm_head(self.hidden(ids))

    def set_sdpa(self, on):
        for layer in self.model.layers:
            layer.self_attn.use_sdpa = on

    def hf_state_dict(self):
        """HF names -> fp32 numpy arrays (lm_head.weight left out when tied)."""
        out = {}
        for k, v in self.state_dict().items():
            if k == "lm_head.weight" and self.config["tie_word_embeddings"]:
                continue
            out[k] = v.detach().float().cpu().numpy()
        return out

    def load_hf_state_dict(self, sd):
        """Inverse of hf_state_dict (numpy or torch values); every parameter must be given."""
        want = set(self.hf_state_dict())
        got = set(sd)
        if want != got:
            raise ValueError("state dict mismatch: missing %s, unexpected %s" % (sorted(want - got)[:5],
                                                                              sorted(got - want)[:5]))
        with torch.no_grad():
            params = dict(self.named_parameters())
            for k, v in sd.items():
                t = torch.as_tensor(v, dtype=torch.float32)
                if tuple(t.shape) != tuple(params[k].shape):
                    raise ValueError("%s: shape %s, expected %s" % (k, tuple(t.shape), tuple(params[k].shape)))
                params[k].copy_(t)

