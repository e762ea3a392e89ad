import os

# The fast path's Triton kernels run on CPU through the interpreter; this must be set
# before triton is imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")
