"""`python3 -m specdec.gpu_check --out DIR`, the one command to run on any CUDA machine from a checkout: the
driver is `specdec.gpu_check.driver` (its parts are in `specdec.gpu_check.parts`)."""
import sys

from specdec.gpu_check.driver import main

if __name__ == "__main__":
    sys.exit(main(prog="python3 -m specdec.gpu_check"))
