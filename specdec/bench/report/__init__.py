"""Drawn only from the CSVs: `tables` (`specdec report CSV`: one CSV's tables, the speed goals), `results_page`
(`specdec report`: docs/results.md), `plots` (`specdec plot`: one figure per schema)."""
