import os

import torch

# The fast path's Triton kernels run on CPU through Triton's interpreter when no CUDA device is
# present; on a GPU the compiled kernels are tested. Must be decided before triton is imported
# (importing torch does not import it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
