"""`python -m specdec.bench.suites.linear`: both CPU fp32 matmul backends of `specdec.models.linear` on the machine at
hand, at one thread, and what the "auto" measurement picks at each row count."""
from __future__ import annotations

import time

import torch

from ...models.linear import Linear, set_cpu_linear_backend


def compare_backends(M_values=(1, 2, 4, 16, 64, 256), k=256, n=1376, repeats=500) -> None:
    """Prints the process CPU time per (M x k) @ (k x n) product of each backend, and "auto"'s choice."""
    torch.set_num_threads(1)
    lin = Linear(k, n, bias=False)
    print(f"(M x {k}) @ ({k} x {n}), fp32, 1 thread, process CPU time per product:")
    for M in M_values:
        x = torch.randn(M, k)
        times = {}
        with torch.inference_mode():
            for name in ("mkl", "onednn"):
                set_cpu_linear_backend(name)
                for _ in range(20):
                    lin(x)
                t0 = time.process_time()
                for _ in range(repeats):
                    lin(x)
                times[name] = (time.process_time() - t0) / repeats * 1e6
            set_cpu_linear_backend("auto")
            chosen = lin.backend_for(M)
        print(f"M={M:4d}  " + "  ".join(f"{name} {us:7.1f} us" for name, us in times.items()) + f"  auto: {chosen}")


if __name__ == "__main__":
    compare_backends()
