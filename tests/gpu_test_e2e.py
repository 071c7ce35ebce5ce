#!/usr/bin/env python3
"""gpu_test_e2e.py - end to end on the GPU: every fixture model of tests/data/models/INDEX.json that
has goldens is converted (tp 1), then for each golden prompt

  * `qshard logits --device cuda` vs `--device cpu` (our CPU backend, the plain-C oracle) and vs
    the transformers goldens (tests/data/golden/<group>/<prompt>.logits.npy): relative L2 <= 1e-2
    and no NaN;
  * `qshard run --device cuda --temp 0 --print-ids`: the 16 greedy ids equal the golden
    greedy_ids wherever the golden top1 - top2 margin is >= 0.05 (below that, fp16 rounding may
    legitimately swap two near-equal logits; those steps and everything after are skipped);
  * 40 ids decoded through the CUDA graphs (one per rank; at tp > 1 they hold our peer-to-peer
    all-reduce kernel, never NCCL) equal 40 ids decoded op by op, and every rank recorded one
    (none for MoE models, none at tp > 1 when the peer-to-peer all-reduce is off);
  * on the first prompt: longer prompts of 24, 40, 100 and 300 pseudo-random ids (the W4A16 kernel
    at 17..32 and 33..64 rows, v7 (wgmma) at 100 rows on Hopper, dequant + cuBLAS above, the
    tensor-core prefill attention over 1-5 key tiles): `logits --device cuda` vs `--device cpu`,
    relative L2 <= 1e-2, no NaN;
  * on the first prompt: ids sampled on the GPU equal ids sampled on the host from the same
    logits with the same seed (four sampler settings), and a one-token prompt decodes the same
    with and without the graph.

With --tp N the fixtures are converted at tensor-parallel size N instead (one GPU per rank, so N
GPUs are needed; the CPU backend runs the same N ranks in one process): a fixture that cannot be
split N ways (convert exits 2 naming --tp) is reported as not applicable, not counted.

Prints "e2e: N passed, N failed" (tests/run_gpu_tests.sh sums it). Needs numpy.
--only S1,S2 keeps the fixtures whose name contains one of the S.
  usage: QSHARD=build/qshard python3 tests/gpu_test_e2e.py [--quick] [--tp N] [--only S]
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
QSHARD = os.environ.get("QSHARD", "build/qshard")
TOL = 1e-2
MARGIN = 0.05
passed = failed = 0


def graph_ranks(stderr):
    """Number of GPUs whose decode-step graph `qshard ... -v` reports as recorded."""
    return len(set(re.findall(r"GPU (\d+): decode step of \d+ rows? recorded as a CUDA graph", stderr)))


def expected_graphs(name, tp, stderr):
    """GPUs that must record a decode graph: every rank, except for MoE models (host routing)
    and at tp > 1 without the peer-to-peer all-reduce (NCCL is never recorded)."""
    if name.find("mixtral") >= 0 or name.find("-moe-") >= 0:  # Mixtral, Qwen3-MoE fixtures
        return 0
    if tp > 1 and "all-reduce: peer-to-peer" not in stderr:
        return 0
    return tp


def check(ok, msg):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL: " + msg, flush=True)


def rel_l2(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / max(np.linalg.norm(b.astype(np.float64)), 1e-30))


def run(args):
    p = subprocess.run([QSHARD] + args, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def run_args(args):
    p = subprocess.run([QSHARD] + args, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout.strip(), p.stderr


SAMPLERS = [  # rt_sample.h steps; the PRNG stream is the host sampler's in both runs
    ["--temp", "0.8", "--top-k", "40", "--top-p", "0.95", "--seed", "11"],
    ["--temp", "1.1", "--top-p", "0.7", "--min-p", "0.05", "--repeat-penalty", "1.3", "--seed", "3"],
    ["--temp", "1.5", "--seed", "7"],
    ["--temp", "0", "--repeat-penalty", "1.2"],
]


def sampling_checks(name, out, ids, tp):
    """Next tokens chosen on the GPU (k_sample, only the id comes back) vs by the host sampler
    on the downloaded row (--debug-host-sample): the same logits and the same PRNG stream give
    the same 40 ids. Then a one-token prompt: its prefill is the first single-token step, so the
    decode graph is recorded while every kernel runs for the first time; its ids must equal the
    op-by-op run's."""
    base = ["run", out, "--tokens", ",".join(str(i) for i in ids), "-n", "40", "--ignore-eos",
            "--print-ids", "--no-echo", "--device", "cuda", "-v"]
    for smp in SAMPLERS:
        res = {}
        for dev in ("1", "0"):
            rc, so, se = run_args(base + smp + ([] if dev == "1" else ["--debug-host-sample"]))
            check(rc == 0, "%s %s: run (%s) exit %d: %s" % (name, " ".join(smp), "device sampling" if dev == "1" else "--debug-host-sample", rc, se.strip()[-400:]))
            res[dev] = (so, se)
        if len(res) < 2:
            continue
        check(res["1"][0] == res["0"][0] and len(res["1"][0].split(",")) == 40,
              "%s %s: ids sampled on the GPU %s != on the host %s" % (name, " ".join(smp), res["1"][0], res["0"][0]))
        on_gpu = "sampling on the GPU" in res["1"][1]
        check(on_gpu, "%s: tp %d: the default run did not sample on the GPU" % (name, tp))
        check("sampling on the host" in res["0"][1], "%s: --debug-host-sample did not sample on the host" % name)
    one = ["run", out, "--tokens", str(ids[0]), "-n", "24", "--temp", "0", "--ignore-eos",
           "--print-ids", "--no-echo", "--device", "cuda", "-v"]
    res = {g: run_args(one + ([] if g == "1" else ["--debug-no-graph"])) for g in ("1", "0")}
    for g, (rc, so, se) in res.items():
        check(rc == 0, "%s: one-token prompt (%s) exit %d: %s" % (name, "graph" if g == "1" else "--debug-no-graph", rc, se.strip()[-400:]))
    check(res["1"][1] == res["0"][1], "%s: one-token prompt: ids with the graph %s != op by op %s" % (name, res["1"][1], res["0"][1]))
    recorded = graph_ranks(res["1"][2])
    expect = expected_graphs(name, tp, res["1"][2])
    check(recorded == expect, "%s: one-token prompt: decode graphs recorded on %d GPUs, expected %d" % (name, recorded, expect))


def logits_cpu_cuda(out, ids, tmp, what):
    """`qshard logits` of the ids (a comma-separated string) on --device cpu and cuda: the two
    arrays (cpu, cuda), or None when either run failed (checked and reported here)."""
    got = {}
    for dev in ("cpu", "cuda"):
        f = os.path.join(tmp, "%s.%s.npy" % (what.replace("/", "."), dev))
        rc, so, se = run(["logits", out, "--tokens", ids, "--out", f, "--device", dev])
        check(rc == 0, "%s: logits --device %s exit %d: %s" % (what, dev, rc, se.strip()[-400:]))
        if rc == 0:
            got[dev] = np.load(f)
    return (got["cpu"], got["cuda"]) if len(got) == 2 else None


def long_prompt_checks(m, out, tmp, tp):
    """Prompts longer than the goldens' (24, 40, 100 and 300 pseudo-random ids below vocab_size):
    every row of the CUDA logits vs the CPU backend's."""
    cfg = json.load(open(os.path.join(ROOT, m["path"], "config.json")))
    vocab, x = m["vocab_size"], 12345
    for n in (24, 40, 100, 300):
        if n > cfg.get("max_position_embeddings", 4096):
            continue
        ids = []
        for _ in range(n):
            x = (x * 1103515245 + 12345) % (1 << 31)
            ids.append(x % vocab)
        got = logits_cpu_cuda(out, ",".join(map(str, ids)), tmp, "%s/long%d" % (m["name"], n))
        if not got:
            continue
        cpu, cu = got
        check(bool(np.isfinite(cu).all()), "%s/long%d: NaN/inf in CUDA logits" % (m["name"], n))
        r = rel_l2(cu, cpu)
        check(cu.shape == (n, vocab) and r <= TOL, "%s/long%d: shape %s, CUDA vs CPU rel L2 %.3g > %g" % (m["name"], n, cu.shape, r, TOL))
        print("%s/long%d: tp %d rel L2 CUDA vs CPU %.2e" % (m["name"], n, tp, r), flush=True)


def main():
    quick = "--quick" in sys.argv
    tp = int(sys.argv[sys.argv.index("--tp") + 1]) if "--tp" in sys.argv else 1
    only = [""]
    if "--only" in sys.argv:
        i = sys.argv.index("--only")
        if i + 1 >= len(sys.argv) or not sys.argv[i + 1]:
            print("gpu_test_e2e.py: --only needs a list of fixture name parts", file=sys.stderr)
            return 2
        only = sys.argv[i + 1].split(",")
    index = json.load(open(os.path.join(ROOT, "models", "INDEX.json")))
    tmp = tempfile.mkdtemp(prefix="qshard-e2e-")
    seen_groups = set()
    for m in index["models"]:
        group = m.get("twin_group") or m["name"]
        gdir = os.path.join(ROOT, "golden", group)
        if not os.path.exists(os.path.join(gdir, "golden.json")):
            continue
        if (quick and group in seen_groups) or not any(s in m["name"] for s in only):
            continue
        seen_groups.add(group)
        golden = json.load(open(os.path.join(gdir, "golden.json")))
        out = os.path.join(tmp, m["name"])
        rc, so, se = run(["convert", os.path.join(ROOT, m["path"]), out, "--tp", str(tp)])
        if tp > 1 and rc == 2 and "--tp" in se:
            print("%s: not applicable at tp %d: %s" % (m["name"], tp, se.strip().splitlines()[0]), flush=True)
            continue
        check(rc == 0, "%s: convert exit %d: %s" % (m["name"], rc, se.strip()[-400:]))
        if rc:
            continue
        for pr in golden["prompts"]:
            ids = ",".join(str(i) for i in pr["ids"])
            got = logits_cpu_cuda(out, ids, tmp, "%s/%s" % (m["name"], pr["name"]))
            if not got:
                continue
            ref = np.load(os.path.join(gdir, pr["logits"]))
            cpu, cu = got
            check(cu.shape == ref.shape, "%s/%s: shape %s vs golden %s" % (m["name"], pr["name"], cu.shape, ref.shape))
            if cu.shape != ref.shape:
                continue
            check(bool(np.isfinite(cu).all()), "%s/%s: NaN/inf in CUDA logits" % (m["name"], pr["name"]))
            r_cpu, r_gold = rel_l2(cu, cpu), rel_l2(cu, ref)
            check(r_cpu <= TOL, "%s/%s: CUDA vs CPU rel L2 %.3g > %g" % (m["name"], pr["name"], r_cpu, TOL))
            check(r_gold <= TOL, "%s/%s: CUDA vs golden rel L2 %.3g > %g" % (m["name"], pr["name"], r_gold, TOL))
            print("%s/%s: tp %d T=%d rel L2 CUDA vs CPU %.2e, vs golden %.2e" % (m["name"], pr["name"], tp, cu.shape[0], r_cpu, r_gold), flush=True)
            want = pr.get("greedy_ids")
            if not want:
                continue
            rc, so, se = run(["run", out, "--tokens", ids, "-n", str(len(want)), "--temp", "0",
                              "--ignore-eos", "--print-ids", "--no-echo", "--device", "cuda"])
            check(rc == 0, "%s/%s: run exit %d: %s" % (m["name"], pr["name"], rc, se.strip()[-400:]))
            if rc:
                continue
            toks = [t for t in so.replace("\n", ",").split(",") if t.strip()]
            gen = [int(t) for t in toks][-len(want):]
            n_ok = 0
            for k, w in enumerate(want):
                if pr["greedy_margins"][k] < MARGIN:
                    break
                n_ok += 1
            check(gen[:n_ok] == want[:n_ok], "%s/%s: greedy ids %s, golden %s (first %d steps compared)" % (m["name"], pr["name"], gen, want, n_ok))
            # decode through the recorded CUDA graph (default) vs op by op (--debug-no-graph):
            # the same kernels on the same data, so the same ids; 40 steps replay it 39 times
            runs = {}
            for graph in ("1", "0"):
                p = subprocess.run([QSHARD, "run", out, "--tokens", ids, "-n", "40", "--temp", "0",
                                    "--ignore-eos", "--print-ids", "--no-echo", "--device", "cuda", "-v"]
                                   + ([] if graph == "1" else ["--debug-no-graph"]),
                                   capture_output=True, text=True, timeout=300)
                check(p.returncode == 0, "%s/%s: run (%s) exit %d: %s" % (m["name"], pr["name"], "graph" if graph == "1" else "--debug-no-graph", p.returncode, p.stderr.strip()[-400:]))
                runs[graph] = (p.stdout.strip(), p.stderr)
            if len(runs) == 2:
                check(runs["1"][0] == runs["0"][0], "%s/%s: 40 greedy ids with the decode graph %s != op by op %s" % (m["name"], pr["name"], runs["1"][0], runs["0"][0]))
                recorded = graph_ranks(runs["1"][1])
                expect = expected_graphs(m["name"], tp, runs["1"][1])
                check(recorded == expect, "%s/%s: decode graphs recorded on %d GPUs, expected %d" % (m["name"], pr["name"], recorded, expect))
            if pr is golden["prompts"][0]:
                sampling_checks(m["name"], out, pr["ids"], tp)
                long_prompt_checks(m, out, tmp, tp)
    check(passed + failed > 0, "no fixture matched --only %s" % ",".join(only))
    print("e2e: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
