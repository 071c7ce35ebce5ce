#!/usr/bin/env python3
"""The Hugging Face baseline of `qshard bench load` (tools/bench_load_gpu.sh): an AWQ checkpoint
directory's safetensors files loaded onto the GPU with safetensors + torch, as a serving engine's
loader starts (no model code: the tensors only, a lower bound for any engine that uses them).

    python3 tools/bench_load_torch.py HF_DIR [--cold]

Prints one line of seconds since this interpreter started (t0: the first statement, before
`import torch`): torch imported, CUDA context ready (torch.cuda.init + a 1-element tensor), every
tensor of every *.safetensors file on cuda:0 (safetensors.torch.load_file(device="cuda:0"),
synchronized), and the GB/s of that load. --cold drops the files from the page cache first
(os.posix_fadvise DONTNEED). The shell script times the whole process from outside as well.
"""
import time

T0 = time.perf_counter()
import argparse  # noqa: E402
import glob  # noqa: E402
import os  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("--cold", action="store_true")
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.hf_dir, "*.safetensors")))
    if not files:
        raise SystemExit("no *.safetensors in %s" % a.hf_dir)
    if a.cold:
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    import torch
    t_import = time.perf_counter() - T0
    torch.cuda.init()
    torch.zeros(1, device="cuda:0")
    torch.cuda.synchronize()
    t_ctx = time.perf_counter() - T0
    from safetensors.torch import load_file
    t1 = time.perf_counter()
    n = 0
    keep = []
    for f in files:
        sd = load_file(f, device="cuda:0")
        n += sum(t.numel() * t.element_size() for t in sd.values())
        keep.append(sd)
    torch.cuda.synchronize()
    t_load = time.perf_counter() - t1
    print("torch+safetensors %s: %.3f GB in %d file(s); import torch %.3f s, CUDA ready %.3f s, "
          "tensors on the GPU %.3f s after start (load %.3f s = %.2f GB/s)"
          % ("cold" if a.cold else "warm", n / 1e9, len(files), t_import, t_ctx,
             time.perf_counter() - T0, t_load, n / 1e9 / t_load), flush=True)


if __name__ == "__main__":
    main()
