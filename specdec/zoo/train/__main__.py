"""`python -m specdec.zoo.train`: `specdec zoo train`."""
import sys

from .cli import main

sys.exit(main())
