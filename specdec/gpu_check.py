"""`python3 -m specdec.gpu_check --out DIR`, the one command to run on any CUDA machine from a checkout: the
driver is `specdec.bench.gpu_check` (its parts are in `specdec.bench.gpu_parts`)."""
import sys

from specdec.bench.gpu_check import main

if __name__ == "__main__":
    sys.exit(main(prog="python3 -m specdec.gpu_check"))
