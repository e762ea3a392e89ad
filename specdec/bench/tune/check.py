"""`specdec tune --check-grid` / `--check-tuned` (step 4 of `search`): the tuned shape, adaptive speculation and
`CHECK_GRID`'s 12 shapes side by side on prompts other than the tuning's, against target-only; and the prompt sets
they decode (`sampled_prompts`, `mixed_prompts`)."""
from __future__ import annotations

import dataclasses

from ... import SamplingParams
from ...tuning import TunedSpec, shape_name
from ..common import Run, cpu_model, dtype_name
from .search import CHECK_GRID, FIXED_TREE, Measurer, TuneRow, batches_of, by_pass, held_out_ratio
from ...draft_kinds import kind_of

def check_grid(m: Measurer, tuned: TunedSpec, prompt_sets: dict, batch_sizes, repeats, rows_out: list,
               run: Run, model_name: str, progress=print) -> dict:
    """The goal's comparison on each named prompt set (not the tuning prompts): target-only, the 12-shape grid
    (S5 K4 W16 among them), the tuned shape and adaptive speculation at each bucket, in turn on every batch of
    each repeat. repeats: the passes, one int for every bucket or one per bucket of `batch_sizes` (a batched pass
    is a few short decodes, and the machine's noise moves each by more than the shapes differ).
    -> per (prompt set, bucket) the ratios."""
    passes = dict(zip(batch_sizes, [repeats] * len(batch_sizes) if isinstance(repeats, int) else repeats))
    kind = kind_of(m.draft).name
    adaptive = tuned.with_adaptive(True)
    out = {}
    for set_name, prompts in prompt_sets.items():
        greedy = [p.is_greedy for p in m.requests(prompts)[1]]
        for B in batch_sizes:
            batches = batches_of(prompts, B)
            greedy_b = greedy[:sum(len(b) for b in batches)]
            keys = [None, *CHECK_GRID, tuned, adaptive]
            med = dict(enumerate(m.decode_in_turn(keys, batches, passes[B], desc=f"check {set_name} (B={B})")))
            base = med[0]
            for i, key in enumerate(keys):
                if key is None:
                    policy, shape, label = "target-only", None, "target-only"
                elif isinstance(key, TunedSpec):
                    policy = "adaptive" if key.adaptive else "tuned"
                    shape = tuned.bucket(B).shape
                    label = f"tuned ({shape_name(shape)})" if policy == "tuned" else "adaptive"
                else:
                    policy, shape, label = "static", key, shape_name(key)
                r = med[i]
                s, k, w = shape if shape is not None else (0, 0, 1)
                same = same_greedy_tokens(r["outs"], base["outs"], greedy_b)
                rows_out.append(TuneRow(
                    **run.prefix(), model=model_name, kind=kind, impl="reference", dtype=dtype_name(m.target.dtype),
                    cpu_model=cpu_model(), batch_size=B, source="check", prompt_set=set_name, policy=policy,
                    label=label, num_steps=s, topk=k, num_draft_tokens=w, num_prompts=len(prompts) - len(prompts) % B,
                    max_new_tokens=m.params.max_new_tokens, mean_accept_len=round(r["accept"], 4),
                    step_ms=round(r["step_ms"], 4), predicted_step_ms="", predicted_tokens_per_cpu_s="",
                    tokens_per_cpu_s=round(r["tokens_per_cpu_s"], 2), tokens_per_cpu_s_by_pass=by_pass(r),
                    speedup_vs_target_only=round(r["tokens_per_cpu_s"] / base["tokens_per_cpu_s"], 4),
                    same_tokens_as_target_only=same, chosen=policy == "tuned"))
            grid = {key: med[i + 1]["tokens_per_cpu_s"] for i, key in enumerate(CHECK_GRID)}
            best_grid = max(grid, key=grid.get)
            t, a = med[len(keys) - 2]["tokens_per_cpu_s"], med[len(keys) - 1]["tokens_per_cpu_s"]
            grid_passes = {key: med[i + 1]["passes"] for i, key in enumerate(CHECK_GRID)}
            t_held = held_out_ratio(med[len(keys) - 2]["passes"], grid_passes)
            a_held = held_out_ratio(med[len(keys) - 1]["passes"], grid_passes)
            same_all = all(same_greedy_tokens(med[i]["outs"], base["outs"], greedy_b) for i in med)
            out[set_name, B] = dict(tuned_over_best_grid=t / grid[best_grid],
                                    tuned_over_fixed_tree=t / grid[FIXED_TREE],
                                    adaptive_over_best_grid=a / grid[best_grid], best_grid=best_grid,
                                    tuned_over_best_grid_held_out=t_held, adaptive_over_best_grid_held_out=a_held,
                                    same_tokens=same_all)
            progress(f"check {set_name} B={B:<3d} tuned {shape_name(tuned.bucket(B).shape)}: {t:8.1f} tok/cpu-s = "
                     f"{t / grid[best_grid]:.3f}x the grid's best ({shape_name(best_grid)} {grid[best_grid]:.1f}), "
                     f"{t / grid[FIXED_TREE]:.3f}x S5 K4 W16; adaptive {a:8.1f} = {a / grid[best_grid]:.3f}x the "
                     f"best; target-only {base['tokens_per_cpu_s']:.1f}; every output identical to target-only: "
                     f"{same_all}" + ("" if t_held is None else
                                      f"; against the grid's best chosen on other passes (median of per-pass ratios): "
                                      f"tuned {t_held:.3f}x, adaptive {a_held:.3f}x"))
    return out


def same_greedy_tokens(outs, base_outs, greedy) -> bool:
    """Whether every greedy request's tokens are target-only's (a sampled request is lossless in distribution, not
    token by token: its draws follow another path through the RNG)."""
    return all(a.token_ids == b.token_ids for a, b, g in zip(outs, base_outs, greedy) if g)


def sampled_prompts(code: list, params: SamplingParams, temperature: float = 1.0) -> list:
    """The code prompts, every other one sampled at `temperature` (a `(prompt, SamplingParams)` pair), the rest
    greedy: requests whose drafts are accepted beside requests whose drafts mostly fail, in every batch of an even
    size. On the zoo pairs a draft accepts far fewer tokens of a sampled continuation (EAGLE's S5 K4 W16 tree on the
    deep pair: 4.9 greedy, 2.9 at temperature 1, in an ad-hoc run), while greedy prose it never saw is no harder
    than code (5.5)."""
    hot = dataclasses.replace(params, temperature=temperature)
    return [p if i % 2 == 0 else (p, hot) for i, p in enumerate(code)]


def mixed_prompts(code: list, prose: list) -> list:
    """Code and prose alternating, so that every batch of an even size holds both."""
    return [p for pair in zip(code, prose) for p in pair]
