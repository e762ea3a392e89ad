"""The models' linear layer: nn.Linear, with oneDNN prepacked weights for CPU inference.

On the x86 CPUs this project is measured on, PyTorch's default fp32 path (MKL sgemm) runs a
(M x 256) @ (256 x 1376) product at 2.2-2.4x the time of oneDNN with the weight prepacked into its
blocked layout, for every M from 2 to 256; for M = 1 (a matrix-vector product) MKL is 10-25 % faster
(`python -m specdec.models.linear` prints both on the machine at hand). A decode step multiplies
mostly small M (B x W tree nodes), so a CPU fp32 forward without autograd uses the prepacked copy
for M >= 2; everything else (one row, autograd, other dtypes and devices, torch.compile, which packs
weights itself) takes F.linear. The copy is made on first use and remade when the weight changes,
and costs one more copy of each weight in memory: `set_prepacked_cpu_linear(False)` turns it off.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_prepacked = {"enabled": True, "available": None}


def set_prepacked_cpu_linear(enabled: bool) -> None:
    """Use (True, the default) or not oneDNN prepacked weights for CPU fp32 inference."""
    _prepacked["enabled"] = bool(enabled)


def _onednn_available() -> bool:
    if _prepacked["available"] is None:
        ok = torch.backends.mkldnn.is_available()
        try:
            ok = ok and hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn,
                                                                                  "_reorder_linear_weight")
        except (AttributeError, RuntimeError):
            ok = False
        _prepacked["available"] = bool(ok)
    return _prepacked["available"]


class Linear(nn.Linear):
    """nn.Linear; CPU fp32 inference on two or more rows multiplies with a oneDNN-prepacked weight."""

    _packed: torch.Tensor | None = None
    _packed_key: tuple | None = None

    def forward(self, x):
        if (x.numel() >= 2 * self.in_features and _prepacked["enabled"] and not x.is_cuda
                and x.dtype == torch.float32 and self.weight.dtype == torch.float32 and x.device.type == "cpu"
                and not torch.is_grad_enabled() and not torch.compiler.is_compiling() and _onednn_available()):
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._prepacked_weight(), self.bias, "none",
                                                      [], "")
        return F.linear(x, self.weight, self.bias)

    def _prepacked_weight(self) -> torch.Tensor:
        w = self.weight
        key = (w.data_ptr(), w._version, tuple(w.shape))
        if self._packed_key != key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)
            self._packed_key = key
        return self._packed


def _compare(M_values=(1, 2, 4, 16, 64, 256), k=256, n=1376, repeats=500) -> None:
    import time
    torch.set_num_threads(1)
    w = torch.randn(n, k)
    lin = Linear(k, n, bias=False)
    lin.weight.data.copy_(w)
    print(f"(M x {k}) @ ({k} x {n}), fp32, 1 thread, process CPU time per product:")
    for M in M_values:
        x = torch.randn(M, k)
        times = {}
        with torch.inference_mode():
            for name, enabled in (("F.linear (MKL)", False), ("oneDNN prepacked", True)):
                set_prepacked_cpu_linear(enabled)
                for _ in range(20):
                    lin(x)
                t0 = time.process_time()
                for _ in range(repeats):
                    lin(x)
                times[name] = (time.process_time() - t0) / repeats * 1e6
        set_prepacked_cpu_linear(True)
        print(f"M={M:4d}  " + "  ".join(f"{name} {us:7.1f} us" for name, us in times.items()))


if __name__ == "__main__":
    _compare()
