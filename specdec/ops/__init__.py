"""The ops' contract, the ground floor of specdec: what `reference`, `fast` and the workers agree on.

`contract` names the ops a worker calls (`WORKER_OPS`) and holds the attention plan, the tree arithmetic, the
padding values and the greedy rule; `draft_tree` the tree selection both op packages export; `logprob_types` and
`logprob_packing` the logprob helper's containers and host packing; `op_checks` the ops' argument checks, built
from the check vocabulary in `specdec.checks`.

This package imports nothing of specdec but `specdec.checks`: never the engine, the workers, the models, the
benchmarks or the zoo. `reference` and `fast` import from specdec only this package and `specdec.checks`
(`tests/ops/test_fast_parity.py` holds all three to it).
"""
