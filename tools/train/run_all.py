#!/usr/bin/env python3
"""The whole demo-model pipeline as one command (issue 21): corpus -> tokenizer -> train -> export
-> transformers check -> AWQ + RTN -> pack GEMM + GEMV -> goldens and quality -> $OUT.

GPU machine (torch 2.x + CUDA, transformers, tokenizers, sentencepiece, safetensors; no network),
from the repository root:

    PYTHONUNBUFFERED=1 python3 tools/train/run_all.py --out "$OUT"

CPU dry run (here: Debian's torch 1.13, no transformers; tiny model, corpus slices, ~2 minutes),
with qshard's CPU perplexity compared against ours; --stub-hf runs the transformers stages against
the stand-ins in stub_hf/ (glue only), --no-hf skips them:

    make NO_CUDA=1 -j2 && /usr/bin/python3 tools/train/run_all.py --tiny --stub-hf \\
        --qshard build/qshard --out build/train-tiny

Stages (each timed and logged; the first failed check stops the run with exit 1):
  corpus     data/kjv-*.txt* checked against SHA256SUMS (corpus.py)
  tokenizer  data/tokenizer.model (sha256); with transformers: tokenizer.json by transformers'
             conversion, ids identical to sentencepiece's on the held-out and validation texts
  train      train.py recipe, early stopping on the validation perplexity
  export     fp16 float checkpoint (the "fp16 model"); $OUT/float.tgz
  hf-check   transformers loads it; logits equal ours (max |d| < 2e-3, rel < 1e-4)
  quantize   AWQ (awq.py, 128 x 512 calibration tokens from the training split) and RTN
  pack       AWQ GEMM + GEMV twins (+ RTN GEMM, not returned), read back bit-exactly;
             $OUT/kjv-llama-awq-gemm.tgz, -gemv.tgz
  ref-check  our torch forward vs the numpy reference (tools/fixtures/ref_forward.py) on AWQ
  quality    held-out perplexity (qshard's chunking, ctx 512) of fp16, AWQ and RTN by our model
             and, with transformers, by transformers (must agree within 1e-4 relative), KL and
             top-1 agreement to fp16, greedy text from each; AWQ goldens as golden.py writes
             them; $OUT/golden.tgz
  qshard     (with --qshard BIN) convert both twins, `qshard perplexity` within 0.1 % (cpu) /
             0.5 % (cuda) of ours, `qshard tokenize` ids equal to sentencepiece's
$OUT gets: run.log, quality.json (rewritten after every stage), float.tgz (or float.tgz.00, .01:
join with cat), kjv-llama-awq-gemm.tgz, kjv-llama-awq-gemv.tgz, golden.tgz.

Per-channel experiment (docs/QUALITY.md section 10; < 2 minutes on one H200): the saved float
checkpoint (cat float.tgz.* | tar xz) quantized with one scale per output channel
(group_size -1) by AWQ and by RTN, the same table, no goldens; GEMM checkpoints only (kept in
--work, not in $OUT), converted and measured by qshard with --qshard:

    python3 tools/train/run_all.py --from-float kjv-llama-fp16 --per-channel --out "$OUT" \
        --qshard build-dev/qshard --qshard-device cuda
"""
import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import util as U  # noqa: E402  (first: puts tools/fixtures on sys.path)
from util import CheckFailed, Stage, check, log  # noqa: E402

PIECE = 15 * 1024 * 1024        # $OUT takes files of at most 16 MiB
CALIB = (128, 512)              # AWQ calibration: samples x tokens (AutoAWQ's defaults)
CALIB_TINY = (8, 128)
PROMPTS = ["In the beginning God created", "And Jesus answered and said unto them,", "The LORD is my shepherd;"]
TINY_CHARS = {"train": 400_000, "valid": 12_000, "heldout": 8_000}


def parse_args(argv):
    ap = argparse.ArgumentParser(description="demo model pipeline (see the module docstring)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "build/train-out", help="results ($OUT)")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--tiny", action="store_true", help="tiny model, corpus slices, a few dozen steps (CPU dry run)")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers stages (no transformers here)")
    ap.add_argument("--stub-hf", action="store_true",
                    help="run the transformers stages against stub_hf/ (glue test where transformers is missing)")
    ap.add_argument("--qshard", default=None, help="qshard binary: convert + perplexity + tokenize checks")
    ap.add_argument("--qshard-device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--model", choices=("demo", "tiny"), default=None,
                    help="model size (default: tiny with --tiny, else demo); --tiny --model demo is a shape test")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's)")
    ap.add_argument("--batch", type=int, default=None, help="training batch (default: the recipe's)")
    ap.add_argument("--train-seconds", type=float, default=None, help="training wall-clock budget")
    ap.add_argument("--from-float", default=None, help="skip training: start from this float checkpoint dir")
    ap.add_argument("--per-channel", action="store_true",
                    help="quantize per output channel (group_size -1): AWQ and RTN GEMM only, no goldens")
    return ap.parse_args(argv)


class Run:
    """State shared by the stages; report is what quality.json holds."""

    def __init__(self, a, torch):
        self.a, self.torch = a, torch
        self.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.out = os.path.abspath(a.out)
        self.work = os.path.abspath(a.work or tempfile.mkdtemp(prefix="qshard-train-"))
        self.times = {}
        self.report = {"args": vars(a), "times": self.times, "checks": []}
        self.tf = None

    def save(self):
        U.write_json(os.path.join(self.out, "quality.json"), self.report)

    def passed(self, what):
        self.report["checks"].append(what)
        log("  check passed: " + what)

    def path(self, *p):
        return os.path.join(self.work, *p)


def stage_corpus(r):
    import corpus
    texts = {s: corpus.load(s) for s in corpus.SPLITS}
    if r.a.tiny:
        texts = {s: t[:TINY_CHARS[s]] for s, t in texts.items()}
    r.texts = texts
    with open(r.path("heldout.txt"), "w", encoding="ascii") as f:
        f.write(texts["heldout"])
    r.report["corpus"] = {s: {"chars": len(t)} for s, t in texts.items()}
    r.passed("corpus files match SHA256SUMS")


def stage_tokenizer(r):
    import tokenizer as TK
    r.sp = TK.load_sp()
    tok_dir = r.path("tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    TK.write_hf_files(tok_dir, r.cfg["max_position_embeddings"])
    if r.tf is not None:
        r.report["tokenizer"] = TK.make_tokenizer_json(r.tf, tok_dir, {"heldout": r.texts["heldout"],
                                                                        "valid": r.texts["valid"]})
        r.passed("tokenizer.json (%s) = sentencepiece ids on held-out and valid" % r.report["tokenizer"]["source"])
    else:
        TK.write_own_tokenizer_json(tok_dir)
        r.report["tokenizer"] = {"source": "ours (no transformers)"}
    r.tok_dir = tok_dir
    r.ids = {s: r.sp.encode(t) for s, t in r.texts.items()}
    r.heldout_ids = [r.cfg["bos_token_id"]] + r.ids["heldout"]
    r.report.setdefault("tokenizer", {})["tokens"] = {s: len(v) for s, v in r.ids.items()}
    log("  tokens: %s" % r.report["tokenizer"]["tokens"])


def stage_train(r):
    import model as M
    import pack as P
    import train as T
    if r.a.from_float:
        with open(os.path.join(r.a.from_float, "config.json")) as f:
            cfg = P.config_from_hf(json.load(f))
        check(cfg == r.cfg, "--from-float config differs from the recipe's model")
        import awq_unpack as AU
        sd = {n: t.f32() for n, t in AU.read_weights(r.a.from_float)[0].items()}
        m = M.LlamaLM(cfg)
        m.load_hf_state_dict(sd)
        r.model = m.eval()
        r.report["train"] = {"from_float": r.a.from_float}
        return
    r.model, rep = T.train(r.cfg, r.tc, r.ids["train"], r.ids["valid"], r.sp, r.device)
    r.report["train"] = rep


def stage_export(r):
    import model as M
    import pack as P
    sd = r.model.hf_state_dict()
    big = max(float(abs(v).max()) for v in sd.values())
    check(big < 6e4, "a weight of magnitude %.3g does not fit fp16" % big)
    r.sd16 = {k: v.astype("float16").astype("float32") for k, v in sd.items()}
    r.float_dir = r.path("kjv-llama-fp16")
    P.write_float(r.float_dir, r.cfg, r.sd16, r.tok_dir)
    fm = M.LlamaLM(r.cfg)
    fm.load_hf_state_dict(r.sd16)
    r.fmodel = fm.to(r.device).eval()
    if r.a.from_float:   # the caller has it already
        names = []
        log("  float checkpoint %.1f MB (from --from-float, not copied to $OUT)" % (P.du(r.float_dir) / 1e6))
    else:
        names = U.write_pieces(os.path.join(r.out, "float.tgz"), U.tar_gz(r.float_dir, "kjv-llama-fp16"), PIECE)
        log("  float checkpoint %.1f MB -> $OUT/%s" % (P.du(r.float_dir) / 1e6, ", ".join(names)))
    r.report["float_checkpoint"] = {"dir": "kjv-llama-fp16", "files": names, "bytes": P.du(r.float_dir)}


def ours_fn(model, device):
    def fn(c):
        return model(c.to(device)).float()
    return fn


def stage_hf_check(r):
    import evaluate as EV
    import hf as H
    r.hf_float = H.load_float(r.torch, r.tf, r.float_dir, r.sd16, r.device)
    ids = EV.chunks_of(r.heldout_ids, r.ctx, r.cfg["bos_token_id"])[:4]
    mx, rel = H.compare(r.torch, H.logits_fn(r.hf_float, r.device), ours_fn(r.fmodel, r.device), ids)
    r.report["hf_check"] = {"max_abs_diff": mx, "rel_l2": rel, "chunks": int(ids.shape[0])}
    check(mx < 2e-3 and rel < 1e-4, "transformers' logits differ from ours: max |d| %.3g, rel %.3g" % (mx, rel))
    r.passed("transformers LlamaForCausalLM = our model (max |d| %.2e, rel %.2e)" % (mx, rel))


def stage_quantize(r):
    import awq as A
    n, t = CALIB_TINY if r.a.tiny else CALIB
    calib = A.calibration(r.ids["train"], n, t, r.cfg["bos_token_id"], r.tc["seed"] + 2)
    r.q = {"rtn": A.rtn(r.fmodel, r.group)}
    r.q["awq"] = A.awq(copy.deepcopy(r.fmodel), calib, r.device, g=r.group)
    r.report["awq"] = r.q["awq"]["report"]
    r.passed("AWQ scale folding keeps every float layer output (rel < 1e-4); torch and numpy quantizers agree")


def checkpoint_names(r):
    """(method, variant, name) of the checkpoints this run writes; AWQ's first."""
    if r.a.per_channel:   # the converter and awq_pack take group_size -1 in the GEMM layout
        return [(m, "gemm", "kjv-llama-%s-pc-gemm" % m) for m in ("awq", "rtn")]
    return [(m, v, "kjv-llama-%s-%s" % (m, v)) for m, v in (("awq", "gemm"), ("awq", "gemv"), ("rtn", "gemm"))]


def awq_names(r):
    return [name for m, _v, name in checkpoint_names(r) if m == "awq"]


def stage_pack(r):
    import awq as A
    import pack as P
    r.qdirs, r.qsd = {}, {}
    for method, variant, name in checkpoint_names(r):
        d = r.path(name)
        P.write_quantized(d, r.cfg, r.q[method], variant, r.tok_dir)
        sd = P.verify_quantized(d, r.q[method], variant)
        ref = A.dequant_state_dict(r.q[method])
        check(set(sd) == set(ref) and all(same_bits(sd[k], ref[k]) for k in sd), "%s: decoded weights differ" % name)
        r.qdirs[name], r.qsd[method] = d, sd
        r.report.setdefault("checkpoints", {})[name] = {"bytes": P.du(d), "files": sorted(os.listdir(d))}
        log("  %s: %.2f MB, read back bit-exactly" % (name, P.du(d) / 1e6))
        if method == "awq" and not r.a.per_channel:
            U.write_pieces(os.path.join(r.out, name + ".tgz"), U.tar_gz(d, name), PIECE)
    pair = sum(P.du(r.qdirs[n]) for n in awq_names(r))
    r.report["awq_pair_bytes"] = pair
    r.passed("%s checkpoints decode bit-exactly (awq_unpack); AWQ %s = %.2f MB" % (
        " + ".join(n for _m, _v, n in checkpoint_names(r)), " + ".join(awq_names(r)), pair / 1e6))


def same_bits(a, b):
    import numpy as np
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def quant_models(r):
    import model as M
    out = {"fp16": r.fmodel}
    for method in ("awq", "rtn"):
        m = M.LlamaLM(r.cfg)
        m.load_hf_state_dict(r.qsd[method])
        out[method] = m.to(r.device).eval()
    return out


def stage_ref_check(r):
    import numpy as np
    import ref_forward as RF
    cfg = json.load(open(os.path.join(r.qdirs[awq_names(r)[0]], "config.json")))
    m = quant_models(r)["awq"]
    worst = 0.0
    for p in PROMPTS[:2]:
        ids = [r.cfg["bos_token_id"]] + r.sp.encode(p)
        ref = RF.forward(cfg, r.qsd["awq"], ids)
        with r.torch.no_grad():
            ours = m(r.torch.tensor([ids], device=r.device))[0].float().cpu().numpy()
        worst = max(worst, float(np.abs(ours - ref).max() / np.abs(ref).max()))
    r.report["ref_check_rel_max"] = worst
    check(worst < 1e-4, "our forward differs from the numpy reference (max |d| / max |ref| %.2e)" % worst)
    r.passed("our torch forward = numpy reference on the AWQ weights (%.1e)" % worst)


def texts_of(r, fns):
    import evaluate as EV
    out = {}
    for name, fn in fns.items():
        out[name] = []
        for p in PROMPTS:
            ids = r.sp.encode(p)
            toks, _ = EV.greedy(fn, [r.cfg["bos_token_id"]] + ids, 24 if r.a.tiny else 48, r.device)
            out[name].append(r.sp.decode(ids + toks))
    return out


def stage_quality(r):
    import evaluate as EV
    import hf as H
    models = quant_models(r)
    ours = {k: ours_fn(m, r.device) for k, m in models.items()}
    bos = r.cfg["bos_token_id"]
    res = EV.evaluate(ours, r.heldout_ids, r.ctx, bos, ref="fp16")
    q = {"ctx": r.ctx, "heldout_tokens": len(r.heldout_ids), "ours": res}
    for k, v in res.items():
        log("  ours %-4s held-out ppl %.4f +/- %.4f (%d chunks) KL to fp16 %.5f top-1 agree %.4f" % (
            k, v["ppl"], v["stderr"], v["chunks"], v["kl_to_ref"], v["top1_agree_ref"]))
    r.ppl_ours = {k: v["ppl"] for k, v in res.items()}
    gen_fns = ours
    if r.tf is not None:
        tmp = r.path("hf-tmp")
        cfg_q = json.load(open(os.path.join(r.qdirs[awq_names(r)[0]], "config.json")))
        hfm = {"fp16": r.hf_float}
        for method in ("awq", "rtn"):
            hfm[method] = H.load_dequant(r.torch, r.tf, cfg_q, r.qsd[method], os.path.join(tmp, method), r.device)
        gen_fns = {k: H.logits_fn(m, r.device) for k, m in hfm.items()}
        hres = EV.evaluate(gen_fns, r.heldout_ids, r.ctx, bos, ref="fp16")
        q["transformers"] = hres
        for k in res:
            d = abs(hres[k]["ppl"] / res[k]["ppl"] - 1)
            check(d < 1e-4, "%s: transformers ppl %.6f vs ours %.6f" % (k, hres[k]["ppl"], res[k]["ppl"]))
        r.passed("transformers perplexities = ours within 1e-4 (fp16, AWQ, RTN)")
    if r.tf is not None and not r.a.per_channel:   # the goldens are those of the group-128 twins
        gdir = r.path("golden")
        gold = H.goldens(r.torch, r.tf, "kjv-llama", [r.qdirs["kjv-llama-awq-gemm"], r.qdirs["kjv-llama-awq-gemv"]],
                         PROMPTS, r.device, gdir, tmp)
        pj = {"ctx": r.ctx, "file": "kjv-heldout.txt", "tokens": len(r.heldout_ids),
              "awq": hres["awq"], "fp16": hres["fp16"], "rtn": hres["rtn"]}
        U.write_json(os.path.join(gdir, "kjv-llama", "perplexity.json"), pj)
        shutil.copyfile(r.path("heldout.txt"), os.path.join(gdir, "kjv-llama", "kjv-heldout.txt"))
        U.write_bytes_atomic(os.path.join(r.out, "golden.tgz"), U.tar_gz(os.path.join(gdir, "kjv-llama"), "kjv-llama"))
        q["golden_prompts"] = [{k: p.get(k) for k in ("name", "text", "ids", "greedy_ids", "greedy_text")}
                               for p in gold["prompts"]]
    q["samples"] = texts_of(r, gen_fns)
    for k, lines in q["samples"].items():
        for s in lines:
            log("  %-4s | %s" % (k, s.replace("\n", " / ")))
    r.report["quality"] = q


def qshard_ppl(r, binary, model_dir):
    out_dir = model_dir + ".qshard"
    shutil.rmtree(out_dir, ignore_errors=True)
    cp = subprocess.run([binary, "convert", model_dir, out_dir, "--tp", "1"], capture_output=True, text=True)
    check(cp.returncode == 0, "qshard convert %s failed (%d): %s" % (model_dir, cp.returncode, cp.stderr[-800:]))
    t0 = time.time()
    cp = subprocess.run([binary, "perplexity", out_dir, "-f", r.path("heldout.txt"), "--ctx", str(r.ctx),
                         "--device", r.a.qshard_device], capture_output=True, text=True)
    check(cp.returncode == 0, "qshard perplexity failed (%d): %s" % (cp.returncode, cp.stderr[-800:]))
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", cp.stdout)
    check(m is not None, "no final estimate in qshard's output: %s" % cp.stdout[-300:])
    return out_dir, float(m.group(1)), time.time() - t0


def stage_qshard(r):
    binary = os.path.abspath(r.a.qshard)
    tol = 1e-3 if r.a.qshard_device == "cpu" else 5e-3
    res = {}
    for name in awq_names(r):
        out_dir, ppl, dt = qshard_ppl(r, binary, r.qdirs[name])
        rel = abs(ppl / r.ppl_ours["awq"] - 1)
        res[name] = {"ppl": ppl, "ours": r.ppl_ours["awq"], "rel": rel, "seconds": round(dt, 1)}
        log("  qshard perplexity %s (%s): %.4f vs ours %.4f (rel %.2e, %.1f s)" % (
            name, r.a.qshard_device, ppl, r.ppl_ours["awq"], rel, dt))
        check(rel < tol, "qshard perplexity %.4f vs ours %.4f: rel %.2e >= %g" % (ppl, r.ppl_ours["awq"], rel, tol))
    # tokenizer.json (what the checkpoints' qshard files use) and tokenizer.model alone
    spm_only = r.path("tok-model-only")
    shutil.rmtree(spm_only, ignore_errors=True)
    shutil.copytree(r.qdirs[awq_names(r)[0]], spm_only)
    os.remove(os.path.join(spm_only, "tokenizer.json"))
    cp = subprocess.run([binary, "convert", spm_only, spm_only + ".qshard", "--tp", "1"], capture_output=True, text=True)
    check(cp.returncode == 0, "qshard convert (tokenizer.model only) failed: %s" % cp.stderr[-500:])
    for label, d in (("tokenizer.json", out_dir), ("tokenizer.model", spm_only + ".qshard")):
        cp = subprocess.run([binary, "tokenize", d, "-f", r.path("heldout.txt"), "--ids"], capture_output=True, text=True)
        check(cp.returncode == 0, "qshard tokenize failed: %s" % cp.stderr[-500:])
        ids = json.loads(cp.stdout)
        check(ids == r.heldout_ids, "qshard tokenize (%s) ids differ from sentencepiece's (%d vs %d tokens)" % (
            label, len(ids), len(r.heldout_ids)))
    res["tokenize_equal"] = True
    r.report["qshard"] = res
    r.passed("qshard perplexity (%s; %s) within %.1f %% of ours; qshard tokenize (tokenizer.json and "
             "tokenizer.model) = sentencepiece on the held-out text" % (", ".join(awq_names(r)), r.a.qshard_device,
                                                                         tol * 100))


def summary(r, ok, err):
    rep = r.report
    lines = ["", "=" * 100, "SUMMARY  (%s; device %s; %s; %s)" % (
        "tiny dry run" if r.a.tiny else "demo model", r.device,
        "per-channel (group_size -1)" if r.a.per_channel else "group 128", "ALL CHECKS PASSED" if ok else "FAILED")]
    c = r.cfg
    lines.append("model: hidden %d, %d layers, %d q / %d kv heads of %d, intermediate %d, vocab %d, tied; ctx %d" % (
        c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
        c["intermediate_size"], c["vocab_size"], c["max_position_embeddings"]))
    t = rep.get("train", {})
    if "steps_done" in t:
        lines.append("train: %d steps (planned %d) in %.0f s, %.0f tok/s, %.2f TFLOP/s; best valid ppl %.3f at step %d" % (
            t["steps_done"], t["steps_planned"], t["seconds"], t["tokens_per_s"], t["achieved_tflops"],
            t["best_valid_ppl"], t["best_step"]))
    q = rep.get("quality")
    if q:
        src = q.get("transformers") or q["ours"]
        lines.append("held-out perplexity (%s, ctx %d, %d tokens):" % (
            "transformers fp32" if "transformers" in q else "ours fp32", q["ctx"], q["heldout_tokens"]))
        lines.append("  %-6s %10s %10s %12s %10s" % ("model", "ppl", "+/-", "KL to fp16", "top1=fp16"))
        for k in ("fp16", "awq", "rtn"):
            v = src[k]
            lines.append("  %-6s %10.4f %10.4f %12.5f %10.4f" % (k, v["ppl"], v["stderr"], v["kl_to_ref"],
                                                               v["top1_agree_ref"]))
        f, a, n = src["fp16"]["ppl"], src["awq"]["ppl"], src["rtn"]["ppl"]
        if n > f:
            lines.append("  AWQ closes %.0f %% of RTN's gap to fp16" % (100 * (n - a) / (n - f)))
    if "qshard" in rep:
        lines.append("qshard: " + ", ".join("%s %.4f (rel %.1e)" % (k, v["ppl"], v["rel"])
                                            for k, v in rep["qshard"].items() if isinstance(v, dict)))
    if "awq_pair_bytes" in rep:
        lines.append("AWQ checkpoints (%s): %.2f MB" % (", ".join(awq_names(r)), rep["awq_pair_bytes"] / 1e6))
    lines.append("stage seconds: " + ", ".join("%s %.1f" % kv for kv in r.times.items()))
    lines.append("checks passed: %d%s" % (len(rep["checks"]), "" if ok else "; FAILED: " + err))
    lines.append("$OUT: " + ", ".join(sorted(os.listdir(r.out))))
    lines.append("=" * 100)
    for ln in lines:
        log(ln)


def main(argv):
    a = parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    U.log_to(os.path.join(a.out, "run.log"))
    import torch
    import train as T
    r = Run(a, torch)
    os.makedirs(r.work, exist_ok=True)
    r.cfg = dict(T.MODEL_TINY if (a.model or ("tiny" if a.tiny else "demo")) == "tiny" else T.MODEL_DEMO)
    r.tc = dict(T.TRAIN_TINY if a.tiny else T.TRAIN_DEFAULTS)
    for k, v in (("steps", a.steps), ("batch", a.batch), ("train_seconds", a.train_seconds)):
        if v is not None:
            r.tc[k] = v
    r.ctx = r.cfg["max_position_embeddings"]
    import awq as A
    r.group = -1 if a.per_channel else A.GROUP
    log("qshard demo-model pipeline: torch %s, device %s, work %s, out %s" % (torch.__version__, r.device,
                                                                             r.work, r.out))
    if r.device.startswith("cuda"):
        log("GPU: %s" % torch.cuda.get_device_name(0))
    ok, err = True, ""
    try:
        import hf as H
        H.setup(torch)
        if a.stub_hf:
            sys.path.insert(0, os.path.join(HERE, "stub_hf"))
        if not a.no_hf:
            import transformers
            r.tf = transformers
            log("transformers %s" % transformers.__version__)
        stages = [("corpus", stage_corpus), ("tokenizer", stage_tokenizer), ("train", stage_train),
                  ("export", stage_export)]
        if r.tf is not None:
            stages.append(("hf-check", stage_hf_check))
        stages += [("quantize", stage_quantize), ("pack", stage_pack), ("ref-check", stage_ref_check),
                   ("quality", stage_quality)]
        if a.qshard:
            stages.append(("qshard", stage_qshard))
        for name, fn in stages:
            with Stage(name, r.times):
                fn(r)
            r.save()
    except CheckFailed as e:
        ok, err = False, str(e)
        log("CHECK FAILED: %s" % e)
    except Exception as e:  # noqa: BLE001 - reported, then the exit code says it
        ok, err = False, "%s: %s" % (type(e).__name__, e)
        log(traceback.format_exc())
    r.report["ok"], r.report["error"] = ok, err
    r.save()
    summary(r, ok, err)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
