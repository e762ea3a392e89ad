#!/usr/bin/env bash
# Every check and benchmark that needs a GPU, in one run (for a session that is lent one).
# Usage, from the repository root on the GPU machine:  bash tests/run_on_gpu.sh
# Writes results/kernels-*.csv, results/e2e-*.csv (with their plots) and results/gpu-pytest.log.
set -uo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 1
pip install -q -e ".[dev]" || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee results/gpu-info.txt
status=0
# 1. The whole suite with compiled kernels (conftest leaves TRITON_INTERPRET unset on CUDA), CUDA-graph
#    replay against eager included; slow grids excluded.
timeout 900 python -m pytest -q -x -p no:cacheprovider 2>&1 | tail -40 | tee results/gpu-pytest.log || status=1
# 2. Kernel sweep (B x S+1 x V, bf16 and fp32) and end-to-end suite; each writes its CSV and plot.
timeout 600 specdec bench --suite kernels --repeats 50 || status=1
timeout 900 specdec bench --suite e2e --repeats 3 || status=1
exit $status
