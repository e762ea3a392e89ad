"""The benchmark suites, one module each: `acceptance` (`specdec bench`), `e2e`, `kernels`, `penalties`, `grammar`,
`draft_vocab`, `draft_cost` (`specdec bench --suite ...`), and the ones run as `python -m specdec.bench.suites.X`:
`kernel_count`, `dflash_scaling`, `target_step`, `verify_rules`, `heads`, `dflash`, `linear`."""
