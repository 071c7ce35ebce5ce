#!/usr/bin/env python3
"""gpu_test_e2e.py - end to end on the GPU: every fixture model of tests/data/models/INDEX.json that
has goldens is converted (tp 1), then for each golden prompt

  * `qshard logits --device cuda` vs `--device cpu` (our CPU backend, the plain-C oracle) and vs
    the transformers goldens (tests/data/golden/<group>/<prompt>.logits.npy): relative L2 <= 1e-2
    and no NaN;
  * `qshard run --device cuda --temp 0 --print-ids`: the 16 greedy ids equal the golden
    greedy_ids wherever the golden top1 - top2 margin is >= 0.05 (below that, fp16 rounding may
    legitimately swap two near-equal logits; those steps and everything after are skipped).

With --tp N the fixtures are converted at tensor-parallel size N instead (one GPU per rank, so N
GPUs are needed; the CPU backend runs the same N ranks in one process): a fixture that cannot be
split N ways (convert exits 2 naming --tp) is reported as not applicable, not counted.

Prints "e2e: N passed, N failed" (tests/run_gpu_tests.sh sums it). Needs numpy.
  usage: QSHARD=build-gpu/qshard python3 tests/gpu_test_e2e.py [--quick] [--tp N]
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
QSHARD = os.environ.get("QSHARD", "build-gpu/qshard")
TOL = 1e-2
MARGIN = 0.05
passed = failed = 0


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


def main():
    quick = "--quick" in sys.argv
    tp = int(sys.argv[sys.argv.index("--tp") + 1]) if "--tp" in sys.argv else 1
    index = json.load(open(os.path.join(ROOT, "models", "INDEX.json")))
    tmp = tempfile.mkdtemp(prefix="qshard-e2e-")
    seen_groups = set()
    for m in index["models"]:
        group = m.get("twin_group") or m["name"]
        gdir = os.path.join(ROOT, "golden", group)
        if not os.path.exists(os.path.join(gdir, "golden.json")):
            continue
        if quick and group in seen_groups:
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
            got = {}
            for dev in ("cpu", "cuda"):
                f = os.path.join(tmp, "%s.%s.%s.npy" % (m["name"], pr["name"], dev))
                rc, so, se = run(["logits", out, "--tokens", ids, "--out", f, "--device", dev])
                check(rc == 0, "%s/%s: logits --device %s exit %d: %s" % (m["name"], pr["name"], dev, rc, se.strip()[-400:]))
                if rc == 0:
                    got[dev] = np.load(f)
            if len(got) < 2:
                continue
            ref = np.load(os.path.join(gdir, pr["logits"]))
            cu, cpu = got["cuda"], got["cpu"]
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
            # decode through the recorded CUDA graph (default) vs op by op (QSHARD_GRAPH=0):
            # the same kernels on the same data, so the same ids; 40 steps replay it 39 times
            runs = {}
            for graph in ("1", "0"):
                env = dict(os.environ, QSHARD_GRAPH=graph)
                p = subprocess.run([QSHARD, "run", out, "--tokens", ids, "-n", "40", "--temp", "0",
                                    "--ignore-eos", "--print-ids", "--no-echo", "--device", "cuda", "-v"],
                                   capture_output=True, text=True, timeout=300, env=env)
                check(p.returncode == 0, "%s/%s: run (QSHARD_GRAPH=%s) exit %d: %s" % (m["name"], pr["name"], graph, p.returncode, p.stderr.strip()[-400:]))
                runs[graph] = (p.stdout.strip(), p.stderr)
            if len(runs) == 2:
                check(runs["1"][0] == runs["0"][0], "%s/%s: 40 greedy ids with the decode graph %s != op by op %s" % (m["name"], pr["name"], runs["1"][0], runs["0"][0]))
                recorded = "recorded as a CUDA graph" in runs["1"][1]
                expect = tp == 1 and m["name"].find("mixtral") < 0  # graphs: one rank, no MoE
                check(recorded == expect, "%s/%s: decode graph recorded: %s, expected %s" % (m["name"], pr["name"], recorded, expect))
    print("e2e: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
