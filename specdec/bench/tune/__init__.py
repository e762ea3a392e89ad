"""`specdec tune`'s measurements (its command line is `specdec.cli.tune`): `search` (the candidate shapes, the
Measurer, the cost model, `tune`) and `check` (the grid check)."""
