"""ScriptedDraft: a draft of set quality, for measuring what speculation would gain with a trained draft of that
quality on any target (a random one on a GPU included), with real verification and exact outputs.

It proposes the target's own greedy continuation of each prompt, which a target-only run of the same request computes
(the script), and departs from it at chosen rates: at depth d of a proposal whose nodes before it agree with the
script, the node agrees with probability `rates[d - 1]` and is otherwise the script's best runner-up at that position
(the target's second most likely token, so never the token greedy verification accepts). After a departure the
proposal goes on along the runners-up, as a real draft goes on proposing after its first mistake. In a tree (topk > 1)
the other branches are the runners-up at each depth of the main path, leaves, the shallowest first, as many as
num_draft_tokens allows. Verification is the engine's own, so every output is the target's.

Under greedy decoding the rates are then exactly the acceptance by depth: the conditional probability that depth d is
accepted when every depth before it was (vLLM's `synthetic` rejection mode sets the same figure by accepting whatever
was proposed, at the price of wrong outputs). A sampled request follows the target's sampled tokens, which leave the
greedy script; a request off its script (or past its end) proposes nothing, a one-node verify.

The script of a request is made the first time the draft sees it (`Engine.prepare`, else the proposer's `start`):
one target-only `Engine` run, greedy, with the request's penalties, stop ids and length (a grammar is not applied:
its tokens agree only where the grammar allows them), kept by prompt and parameters, so that a benchmark's warm-up
pass makes it and its timed passes only read it. It runs in the reference ops on the target's device and dtype;
where another path's greedy token differs from the reference's (a near tie in bfloat16), that position counts as a
departure.

`specdec bench --draft scripted:0.8,0.7,0.6,0.5,0.4` (`draft_from_text`) runs it; `scripted_draft_for(target)` makes
the one the speed runs use (`DEFAULT_RATES`).
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

import torch

from ..checks import check_int, check_real
from ..config import SamplingParams

#: the agreement by depth of the speed runs' scripted draft: about what a well-trained EAGLE head reaches on a 7-8B
#: target at depth 1, falling by a tenth a depth
DEFAULT_RATES = (0.8, 0.7, 0.6, 0.5, 0.4)


@dataclass(frozen=True, eq=False)
class ScriptedDraft:
    """target: the model whose continuations are the script (the engine's target: refused otherwise);
    rates: the agreement at depths 1, 2, ... (each in [0, 1]; deeper nodes than the list are runners-up);
    runners_up: how many of the target's next most likely tokens the script keeps per position (a tree's other
    branches take at most that many per depth); seed: the host generator that draws agreement."""

    target: torch.nn.Module = field(repr=False)
    rates: tuple[float, ...] = DEFAULT_RATES
    runners_up: int = 3
    seed: int = 0
    #: the scripts made so far: (prompt, the request's parameters) -> (continuation, runners-up per position)
    scripts: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        rates = self.rates if isinstance(self.rates, (tuple, list)) else (self.rates,)
        if not rates:
            raise ValueError("ScriptedDraft rates must name at least one depth, got none")
        object.__setattr__(self, "rates", tuple(check_real(f"rates[{i}]", r, 0.0, 1.0) for i, r in enumerate(rates)))
        check_int("runners_up", self.runners_up, 1)
        check_int("seed", self.seed, 0)

    def new_proposer(self) -> "ScriptedProposer":
        return ScriptedProposer(self)

    def bounds(self, num_steps: int, topk: int) -> tuple[int, int]:
        """A proposal's depth and children per node under a SpecConfig: num_steps levels, and on the main path its
        agreeing node plus at most `runners_up` others."""
        return num_steps, min(topk, self.runners_up + 1)

    def prepare(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[tuple[list[int], list]]:
        """Each request's script (continuation, runners-up per position), made by one target-only run for those
        not made yet (`Engine.prepare` calls it before the benchmarks' timed passes)."""
        vocab = self.target.config.vocab_size
        requests = [(tuple(p), _script_params(sp, min(self.runners_up + 1, vocab))) for p, sp in zip(prompts, params)]
        keys = [(prompt, repr(sp)) for prompt, sp in requests]  # SamplingParams is not hashable: its repr is
        todo = dict((key, request) for key, request in zip(keys, requests) if key not in self.scripts)
        if todo:
            self._make_scripts(list(todo), list(todo.values()))
        return [self.scripts[k] for k in keys]

    def _make_scripts(self, keys, requests) -> None:
        # lazy: the engine sits above the workers, which hold this draft
        from ..engine import Engine
        longest = max(len(prompt) + params.max_new_tokens for prompt, params in requests)
        max_len = min(longest + 1, self.target.config.max_position_embeddings)
        engine = Engine(self.target, impl="reference", max_batch=len(requests), max_seq_len=max_len,
                        cuda_graphs=False)
        outs = engine.generate([list(prompt) for prompt, _ in requests], [params for _, params in requests])
        for key, out in zip(keys, outs):
            runners = [[t for _, t in top if t != token][:self.runners_up]
                       for token, top in zip(out.token_ids, out.top_logprobs)]
            self.scripts[key] = (list(out.token_ids), runners)


def _script_params(params: SamplingParams, top: int) -> SamplingParams:
    """The greedy target-only request whose output is the script of a request with `params`, with the `top` most
    likely tokens at each position (the script's token and its runners-up)."""
    return dataclasses.replace(params, temperature=0.0, top_k=-1, top_p=1.0, return_logprob=True,
                               top_logprobs_num=top, token_ids_logprob=None, json_schema=None, regex=None, ebnf=None)


def scripted_draft_for(target) -> ScriptedDraft:
    """The scripted draft the speed runs use on `target`: `DEFAULT_RATES`."""
    return ScriptedDraft(target)


def draft_from_text(target, text: str) -> ScriptedDraft:
    """`--draft scripted:0.8,0.7,0.6`: the rates by depth, comma-separated (none: `DEFAULT_RATES`)."""
    if not text:
        return ScriptedDraft(target)
    try:
        rates = tuple(float(r) for r in text.split(","))
    except ValueError:
        raise ValueError(f"scripted draft rates must be comma-separated numbers in [0, 1], got {text!r}") from None
    return ScriptedDraft(target, rates)


class ScriptedProposer:
    """What the host-proposal worker calls for a `ScriptedDraft`: the batch's scripts, and where each request is
    on its script."""

    def __init__(self, draft: ScriptedDraft):
        self.draft = draft
        self.rng = random.Random(draft.seed)
        self._scripts: list[tuple[list[int], list]] = []
        self._prompt_lens: list[int] = []

    def clear(self) -> None:
        """Nothing learned across requests: the scripts are the target's, not the draft's."""

    def start(self, prompts: list[list[int]], params: list[SamplingParams]) -> None:
        self._scripts = self.draft.prepare(prompts, params)
        self._prompt_lens = [len(p) for p in prompts]

    def filter(self, keep: list[int]) -> None:
        self._scripts = [self._scripts[i] for i in keep]
        self._prompt_lens = [self._prompt_lens[i] for i in keep]

    def propose(self, seqs: list[list[int]], new: list[list[int]], max_nodes: int, depth: int,
                breadth: int) -> list[list[tuple[int, int]]]:
        return [self._tree(seq, n_prompt, script, max_nodes, depth, breadth)
                for seq, n_prompt, script in zip(seqs, self._prompt_lens, self._scripts)]

    def _tree(self, seq, n_prompt, script, max_nodes, depth, breadth) -> list[tuple[int, int]]:
        """(token, parent) nodes: the main path first (node d at depth d), then the runners-up beside it, the
        shallowest first."""
        continuation, runners = script
        done = len(seq) - n_prompt  # the output so far, its last token the root
        if seq[n_prompt:] != continuation[:done]:
            return []  # off the script: a sampled request that left it
        depth = min(depth, max_nodes, len(continuation) - done)
        path, agreeing = [], True
        for d in range(depth):
            at = done + d
            agreeing = agreeing and self.rng.random() < self.draft.rates[d] if d < len(self.draft.rates) else False
            if agreeing:
                path.append(continuation[at])
            elif runners[at]:
                path.append(runners[at][0])
            else:
                break  # no runner-up kept at this position (a vocabulary of one token)
        nodes = [(token, d) for d, token in enumerate(path)]
        for d in range(len(path)):
            # the runners-up never hold the script's token: a departure leaves it out of the whole depth
            for token in [t for t in runners[done + d] if t != path[d]][:breadth - 1]:
                if len(nodes) == max_nodes:
                    return nodes
                nodes.append((token, d))
        return nodes
