"""The models' linear layer: nn.Linear whose CPU fp32 inference picks its matmul backend by measurement.

Which CPU backend is faster depends on the machine, the weight's shape and the number of rows, more than
any constant says. For a (M x 256) @ (256 x 1376) product at one thread, oneDNN with the weight prepacked
into its blocked layout against PyTorch's default path (MKL sgemm): on this project's AMD EPYC, 1.5x slower
at M = 1, even at M = 2, 1.6x faster at M = 4 and 2.0-2.3x from M = 16 up; on an Intel Xeon with AMX, 2.2x
slower at M = 2 and only 1.2x faster at M = 16.
So on first use of each (weight shape, row bucket) a CPU fp32 forward without autograd times both
backends on that weight (a few milliseconds, cached per process) and keeps the faster one; the row bucket
is M rounded up to a power of two, at most `MEASURED_ROWS_MAX`. Everything else (autograd, other dtypes and
devices, torch.compile, which packs weights itself) takes F.linear. The packed copy is made on first use of
oneDNN for a weight, remade when the weight changes, and costs one more copy of it in memory.

`set_cpu_linear_backend("auto" | "mkl" | "onednn")` forces either (`"mkl"` means F.linear, whatever BLAS
torch was built with; a single row without a bias goes to torch.mv, the same gemv without F.linear's reshapes);
`cpu_linear_choices()` says what "auto" chose; `python -m specdec.bench.suites.linear` prints both backends' times on
the machine at hand.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

BACKENDS = ("auto", "mkl", "onednn")

_state = {"mode": "auto", "onednn": None}
#: (out_features, in_features, bias, row bucket) -> "mkl" | "onednn", what "auto" measured
_choices: dict[tuple, str] = {}

#: each backend is timed for about this long per (shape, bucket), best of three rounds
_MEASURE_S = 2e-3


def set_cpu_linear_backend(mode: str) -> None:
    """CPU fp32 inference: "auto" (default; the faster backend per weight shape and row bucket, measured at
    first use), "mkl" (always F.linear) or "onednn" (always the prepacked oneDNN product)."""
    if mode not in BACKENDS:
        raise ValueError(f"cpu linear backend must be one of {BACKENDS}, got {mode!r}")
    if mode == "onednn" and not _onednn_available():
        raise ValueError("cpu linear backend 'onednn': this torch build has no oneDNN linear ops")
    _state["mode"] = mode


def set_prepacked_cpu_linear(enabled: bool) -> None:
    """Older switch: True = "auto", False = "mkl"."""
    set_cpu_linear_backend("auto" if enabled else "mkl")


def cpu_linear_backend() -> str:
    return _state["mode"]


def cpu_linear_choices() -> dict[tuple, str]:
    """(out_features, in_features, bias, row bucket) -> the backend "auto" measured faster, so far."""
    return dict(_choices)


def cpu_linear_summary() -> str:
    """One line for benchmark rows: the mode, and under "auto" how many (shape, bucket) chose each backend."""
    mode = _state["mode"]
    if mode != "auto":
        return mode
    n = sum(v == "onednn" for v in _choices.values())
    return f"auto (onednn {n}, mkl {len(_choices) - n})"


def _onednn_available() -> bool:
    if _state["onednn"] is None:
        ok = torch.backends.mkldnn.is_available()
        try:
            ok = ok and hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn,
                                                                                  "_reorder_linear_weight")
        except (AttributeError, RuntimeError):
            ok = False
        _state["onednn"] = bool(ok)
    return _state["onednn"]


#: products of more rows share the backend measured at this many: by then both backends are compute-bound and
#: their ratio has settled, while timing them at a prefill's or a batch-of-thousands' full row count costs as
#: much as several of its forwards
MEASURED_ROWS_MAX = 1024


def _row_bucket(rows: int) -> int:
    return min(1 << max(0, rows - 1).bit_length(), MEASURED_ROWS_MAX)


class Linear(nn.Linear):
    """nn.Linear; CPU fp32 inference multiplies with the backend chosen for its shape and row count."""

    _packed: torch.Tensor | None = None
    _packed_key: tuple | None = None

    def forward(self, x):
        # the parameters straight from their dict: nn.Module's attribute lookup costs about a microsecond a read,
        # a tenth of a small layer's product on a CPU
        params = self._parameters
        weight = params["weight"]
        if (x.is_cpu and x.dtype is torch.float32 and weight.dtype is torch.float32 and not torch.is_grad_enabled()
                and not torch.compiler.is_compiling()):
            rows = x.numel() // self.in_features
            if _state["mode"] != "mkl" and rows and self._route(rows) == "onednn":
                return self._onednn(x)
            return self._mkl(x, rows)
        return F.linear(x, weight, params["bias"])

    def _mkl(self, x, rows: int):
        """F.linear's product. One row without a bias is torch.mv, the same BLAS gemv F.linear reaches (bitwise
        equal, tests/models/test_models.py) without its 2-D reshapes and transposes: a third less time per call for the
        decode step's small products on this machine."""
        params = self._parameters
        if rows == 1 and params["bias"] is None:
            return torch.mv(params["weight"], x.reshape(-1)).view(*x.shape[:-1], self.out_features)
        return F.linear(x, params["weight"], params["bias"])

    def _route(self, rows: int) -> str:
        """`backend_for(rows)`, remembered per layer and mode ("mkl" where this torch has no oneDNN linear ops)."""
        routes = self.__dict__.setdefault("_routes", {})
        key = (_state["mode"], rows)
        backend = routes.get(key)
        if backend is None:
            backend = routes[key] = self.backend_for(rows) if _onednn_available() else "mkl"
        return backend

    def _onednn(self, x):
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._prepacked_weight(), self.bias, "none", [], "")

    def backend_for(self, rows: int) -> str:
        """The backend ("mkl" or "onednn") this weight uses for `rows` input rows, measured once per row bucket."""
        if _state["mode"] == "onednn":
            return "onednn"
        key = (self.out_features, self.in_features, self.bias is not None, _row_bucket(rows))
        if key not in _choices:
            _choices[key] = self._measure(key[-1])
        return _choices[key]

    def _measure(self, rows: int) -> str:
        """Times the "mkl" product (`_mkl`) and the prepacked one on `rows` random rows with this weight -> the
        faster."""
        x = torch.randn(rows, self.in_features)
        runs = {"mkl": lambda: self._mkl(x, rows), "onednn": lambda: self._onednn(x)}
        t0 = time.perf_counter()
        for run in runs.values():
            run()  # the first oneDNN call packs the weight
        per_call = max((time.perf_counter() - t0) / 2, 1e-7)
        reps = max(1, min(50, int(_MEASURE_S / per_call)))
        best = {}
        for _ in range(3):
            for name, run in runs.items():
                t = time.perf_counter()
                for _ in range(reps):
                    run()
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - t)
        return "onednn" if best["onednn"] < best["mkl"] else "mkl"

    def _prepacked_weight(self) -> torch.Tensor:
        w = self.weight
        # an inference tensor (a model built under torch.inference_mode) keeps no version counter
        key = (w.data_ptr(), None if w.is_inference() else w._version, tuple(w.shape))
        if self._packed_key != key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)
            self._packed_key = key
        return self._packed
