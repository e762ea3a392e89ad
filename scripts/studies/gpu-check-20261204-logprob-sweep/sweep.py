"""The fused logprob kernels' accumulation mode x tile x warps at 256 x 151,936 bf16 without temperature scaling,
on one GPU, against a copy (read + write bytes, as gpu-check's ceiling).

Ran once on the H200 of 2026-12-04 at commit fa378ef, whose launcher took `_acc`, `_block_v` and `_num_warps`
(`python3 scripts/studies/gpu-check-20261204-logprob-sweep/sweep.py --out $OUT`; its output is
results/gpu-check-20261204/logprob-sweep/sweep.csv); the chosen
per-lane sums over 2048-wide tiles are the only mode since, so it runs only at that commit. Like gpu-check's
`fast_kernels` rows: the two launches alone, replayed from a CUDA graph over rotated copies of the logits (more
than twice the L2), each variant checked against float64 first. `--smoke` runs a tiny case on a CPU (Triton's
interpreter, no timing)."""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

#: (accumulation mode, tile, warps), the shipped one first.
VARIANTS = [(0, 1024, 4), (2, 1024, 4), (1, 1024, 4), (2, 2048, 4), (1, 2048, 4), (2, 4096, 8), (1, 4096, 8),
            (0, 4096, 8), (2, 2048, 8), (1, 2048, 8), (0, 2048, 4), (2, 1024, 2)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--deadline", type=float, default=150.0)
    a = ap.parse_args()
    if a.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from fast.logprobs import compute_spec_v2_logprobs_launch
    t0 = time.time()
    dev = "cpu" if a.smoke else "cuda"
    R, V = (4, 3000) if a.smoke else (256, 151_936)
    copies = 1 if a.smoke else 4  # 4 x 77.8 MB > 2 x 60 MB of L2
    gen = torch.Generator().manual_seed(0)
    base = (torch.randn(R, V, generator=gen) * 3).to(torch.bfloat16)
    logits = [base.to(dev) for _ in range(copies)]
    predict = torch.randint(0, V, (R,), generator=gen).to(dev)
    rows = torch.arange(R, device=dev)
    valid = torch.ones(R, dtype=torch.bool, device=dev)
    x = base.double()
    want_lse = torch.logsumexp(x, dim=1)
    want_lp = x[torch.arange(R), predict.cpu()] - want_lse

    copy_gbps = float("nan")
    if not a.smoke:
        src = torch.empty(2 ** 30 // 4, dtype=torch.float32, device=dev).normal_()
        dst = torch.empty_like(src)
        g = torch.cuda.CUDAGraph()
        dst.copy_(src)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(2):
                dst.copy_(src)
        g.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            g.replay()
        end.record()
        torch.cuda.synchronize()
        copy_gbps = 10 * 2 * src.numel() * 4 / (start.elapsed_time(end) / 1e3) / 1e9
        del src, dst
        print(f"copy: {copy_gbps:.0f} GB/s (read + write)", flush=True)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sweep.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["acc", "block_v", "num_warps", "rows", "vocab", "dtype", "max_lse_err", "max_lp_err", "us",
                    "gbps", "copy_gbps", "frac_of_copy", "status"])
        for acc, block_v, warps in VARIANTS:
            if time.time() - t0 > a.deadline:
                print("deadline: the rest not run", flush=True)
                break
            kw = dict(_acc=acc, _block_v=block_v, _num_warps=warps)
            try:
                lp, _, _, _, stats = compute_spec_v2_logprobs_launch(logits[0], predict, rows, valid, None, None, 1,
                                                                     0, **kw)
                lse = (stats[:, 0] + stats[:, 1]).double().cpu()
                lse_err = float((lse - want_lse).abs().max())
                lp_err = float((lp.double().cpu() - want_lp).abs().max())
                us = gbps = frac = float("nan")
                if not a.smoke:
                    g = torch.cuda.CUDAGraph()
                    torch.cuda.synchronize()
                    with torch.cuda.graph(g):
                        for c in logits:
                            compute_spec_v2_logprobs_launch(c, predict, rows, valid, None, None, 1, 0, **kw)
                    g.replay()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    reps = 20
                    start.record()
                    for _ in range(reps):
                        g.replay()
                    end.record()
                    torch.cuda.synchronize()
                    us = start.elapsed_time(end) * 1e3 / (reps * copies)
                    gbps = R * V * 2 / (us / 1e6) / 1e9
                    frac = gbps / copy_gbps
                status = "ok" if lse_err < 1e-4 and lp_err < 1e-4 else "WRONG"
            except Exception as e:  # one variant's failure is its row
                lse_err = lp_err = us = gbps = frac = float("nan")
                status = f"error: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            row = [acc, block_v, warps, R, V, "bfloat16", f"{lse_err:.2e}", f"{lp_err:.2e}", f"{us:.1f}",
                   f"{gbps:.0f}", f"{copy_gbps:.0f}", f"{frac:.3f}", status]
            w.writerow(row)
            f.flush()
            print(" ".join(map(str, row)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
