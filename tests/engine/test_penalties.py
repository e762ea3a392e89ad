"""Penalties, min_new_tokens and logit bias: the op against its per-node loop and by hand, fast against
reference, every worker against transformers' generate and against plain decoding with the penalties applied by
hand in float64, the exact distribution when sampling, and SGLang's approximation shown to differ."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import fast
import reference
from reference.naive import apply_penalties_tree_naive
from specdec import Engine, SamplingParams, SpecConfig
from specdec.models import random_eagle_head, random_llama, random_mtp
from specdec.workers.graphs import DecodeGraphs
from specdec.zoo.corpus import heldout_prompts
from tests.helpers.equivalence import assert_equivalent
from tests.helpers import FALSE_FAILURE_RATE, LOGPROB_ATOL, assert_same_as_baseline, bigram_target, \
    chi_square_pvalue, near_bigram_target, perfect_eagle, perfect_mtp
from tests.helpers import ZOO_WORKERS as WORKERS
from specdec.lab import target_law
from tests.helpers.oracles import penalised_greedy_decode

OPS = {"reference": reference.apply_penalties_tree, "naive": apply_penalties_tree_naive,
       "fast": fast.apply_penalties_tree}


# ---- the op ---------------------------------------------------------------------------------------------------

def _tree_mask(parents: list[int], B: int) -> torch.Tensor:
    W = len(parents)
    mask = torch.zeros(W, W, dtype=torch.bool)
    for i in range(W):
        j = i
        while j != -1:
            mask[i, j] = True
            j = parents[j]
    return mask.expand(B, W, W).contiguous()


def _op_case(B, parents, V, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    W = len(parents)
    candidates = torch.randint(V, (B, W), generator=gen)
    if W > 2:
        candidates[:, 2] = candidates[:, 1]  # a token twice on a path
    return dict(
        logits=(torch.randn(B * W, V, generator=gen) * 3).to(dtype), candidates=candidates,
        tree_mask=_tree_mask(parents, B),
        output_counts=torch.randint(0, 3, (B, V), generator=gen, dtype=torch.int32) * (torch.rand(B, V, generator=gen)
                                                                                        < 0.3),
        prompt_mask=torch.rand(B, V, generator=gen) < 0.2, output_lens=torch.randint(0, 4, (B,), generator=gen),
        frequency_penalties=torch.rand(B, generator=gen) * 4 - 2,
        presence_penalties=torch.rand(B, generator=gen) * 4 - 2,
        repetition_penalties=torch.rand(B, generator=gen) * 1.5 + 0.5, min_new_tokens=torch.randint(0, 6, (B,),
                                                                                                     generator=gen),
        stop_mask=torch.rand(B, V, generator=gen) < 0.05,
        logit_bias=torch.randn(B, V, generator=gen) * (torch.rand(B, V, generator=gen) < 0.1))


# awkward shapes: one node, one token, a vocabulary that is not a multiple of the kernel's block, a chain, a tree
SHAPES = [(1, [-1], 1), (2, [-1], 7), (3, [-1, 0, 1, 2], 1025), (2, [-1, 0, 0, 1, 3, 3, 2], 37), (1, [-1, 0], 2048)]


@pytest.mark.parametrize("B, parents, V", SHAPES)
@pytest.mark.parametrize("tree", [True, False])
def test_reference_equals_the_per_node_loop(B, parents, V, tree):
    case = _op_case(B, parents, V, seed=V + B)
    if not tree:
        case["tree_mask"] = None
    got, want = OPS["reference"](**case), OPS["naive"](**case)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite], atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("B, parents, V", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tree", [True, False])
def test_fast_equals_reference(B, parents, V, dtype, tree):
    case = _op_case(B, parents, V, seed=3 * V + B, dtype=dtype)
    if not tree:
        case["tree_mask"] = None
    assert_equivalent(OPS["reference"](**case), OPS["fast"](**case), "penalised_logits", dtype)


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_rows_other_than_the_nodes_follow_their_own_paths(impl):
    """A draft step's call: R = 3 frontier rows over W = 6 candidates (tree_mask (B, R, W)), each row's path an
    arbitrary subset of the candidates: equal to the per-row loop."""
    case = _op_case(2, [-1, 0, 1, 1, 0, 4], 50, seed=7)
    gen = torch.Generator().manual_seed(8)
    case["tree_mask"] = torch.rand(2, 3, 6, generator=gen) < 0.5
    case["tree_mask"][:, :, 0] = True
    case["logits"] = case["logits"][:6]
    got, want = OPS[impl](**case), OPS["naive"](**case)
    assert got.shape == (6, 50) and torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite], atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("impl", OPS)
def test_a_node_is_penalised_by_its_own_path(impl):
    """By hand: V = 4, a root and two children (0 -> 1 -> 2, tokens 1 and 1), committed counts {3: 1}, the prompt
    holds token 0; frequency 1, presence 0.5, repetition 2, bias +1 on token 2, stop id 2 held until 2 tokens
    are out (output_lens = 1: held at the root only)."""
    logits = torch.tensor([[1.0, 2.0, -1.0, 4.0]] * 3)
    case = dict(logits=logits, candidates=torch.tensor([[3, 1, 1]]), tree_mask=_tree_mask([-1, 0, 1], 1),
                output_counts=torch.tensor([[0, 0, 0, 1]], dtype=torch.int32),
                prompt_mask=torch.tensor([[True, False, False, False]]), output_lens=torch.tensor([1]),
                frequency_penalties=torch.tensor([1.0]), presence_penalties=torch.tensor([0.5]),
                repetition_penalties=torch.tensor([2.0]), min_new_tokens=torch.tensor([2]),
                stop_mask=torch.tensor([[False, False, True, False]]), logit_bias=torch.tensor([[0.0, 0.0, 1.0, 0.0]]))
    inf = float("-inf")
    want = torch.tensor([
        [0.5, 2.0, inf, (4.0 - 1.5) / 2],                     # root: counts {3: 1}
        [0.5, (2.0 - 1.5) / 2, 0.0, (4.0 - 1.5) / 2],         # depth 1: {3: 1, 1: 1}; token 2 no longer held
        [0.5, (2.0 - 2.5) * 2, 0.0, (4.0 - 1.5) / 2],         # depth 2: {3: 1, 1: 2}
    ])
    got = OPS[impl](**case)
    assert torch.equal(got, want), got
    root_only = OPS[impl](**dict(case, tree_mask=None))
    assert torch.equal(root_only, want[:1].expand(3, 4)), root_only  # SGLang's approximation: every node as the root


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(logits=c["logits"][:-1]), r"logits must have shape \(6, \*\)"),
    (lambda c: c.update(output_counts=c["output_counts"].float()), "output_counts must have an integer dtype"),
    (lambda c: c.update(tree_mask=c["tree_mask"][:, :, :2]), "tree_mask must have shape"),
    (lambda c: c.update(stop_mask=c["stop_mask"].int()), "stop_mask must have a bool dtype"),
    (lambda c: c.update(repetition_penalties=c["repetition_penalties"][:1]), "repetition_penalties must have shape"),
])
@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_bad_op_arguments_are_value_errors(impl, edit, match):
    case = _op_case(2, [-1, 0, 1], 9, seed=0)
    edit(case)
    with pytest.raises(ValueError, match=match):
        OPS[impl](**case)


# ---- SamplingParams -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    (dict(frequency_penalty=2.5), r"request 0: frequency_penalty must be a number in \[-2.0, 2.0\], got 2.5"),
    (dict(presence_penalty=float("nan")), "request 0: presence_penalty must be a number .*got nan"),
    (dict(presence_penalty=True), "request 0: presence_penalty must be a number .*got bool True"),
    (dict(repetition_penalty=0.0), "request 0: repetition_penalty must be a finite number > 0.0, got 0.0"),
    (dict(repetition_penalty=float("inf")), "request 0: repetition_penalty must be a finite number"),
    (dict(min_new_tokens=17), r"request 0: min_new_tokens must be an int in \[0, 16\], got 17"),
    (dict(min_new_tokens=-1), r"request 0: min_new_tokens must be an int in \[0, 16\], got -1"),
    (dict(logit_bias={64: 1.0}), r"request 0: logit_bias key 64 must be an int in \[0, 63\]"),
    (dict(logit_bias={True: 1.0}), "request 0: logit_bias key True must be an int"),
    (dict(logit_bias={"x": 1.0}), "request 0: logit_bias key 'x' must be an int"),
    (dict(logit_bias={3: float("inf")}), r"request 0: logit_bias\[3\] must be finite or -inf"),
    (dict(logit_bias={3: float("nan")}), r"request 0: logit_bias\[3\] must be a number, got nan"),
    (dict(logit_bias=[1, 2]), "request 0: logit_bias must be a dict"),
])
def test_bad_penalties_are_value_errors_and_the_engine_keeps_serving(kw, match):
    engine = Engine(random_llama(vocab_size=64, hidden_size=32), max_batch=2, max_seq_len=64)
    before = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))[0].token_ids
    with pytest.raises(ValueError, match=match):
        engine.generate([[1, 2, 3]], SamplingParams(**kw))
    assert engine.worker.cache.num_free == 2
    assert engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))[0].token_ids == before


def test_logit_bias_takes_the_json_form():
    sp = SamplingParams(logit_bias={"5": 1.5, 7: -2}).validated(0, 64)
    assert sp.logit_bias == {5: 1.5, 7: -2.0} and sp.has_penalties
    assert not SamplingParams().has_penalties


# ---- every worker against transformers and against plain decoding by hand ----------------------------------------

CI_WORKERS = ["EAGLE tree S5 K4 W16", "MTP Step-3.5 S3"]


def _hf_greedy(model, prompt, max_new_tokens, **kw) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=0, **kw)
    return out[0, len(prompt):].tolist()


def _hf_model(path):
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _hf_cases(eos: int):
    """(our SamplingParams, transformers' generate kwargs) pairs, greedy."""
    return {
        "repetition 1.1": (SamplingParams(max_new_tokens=20, repetition_penalty=1.1), dict(repetition_penalty=1.1)),
        "repetition 1.5": (SamplingParams(max_new_tokens=20, repetition_penalty=1.5), dict(repetition_penalty=1.5)),
        "repetition 0.8": (SamplingParams(max_new_tokens=20, repetition_penalty=0.8), dict(repetition_penalty=0.8)),
        "min_new_tokens": (SamplingParams(max_new_tokens=20, min_new_tokens=12, stop_token_ids=[eos]),
                           dict(min_new_tokens=12, eos_token_id=eos)),
        "logit_bias": (SamplingParams(max_new_tokens=20, logit_bias={eos: 3.0, 32: 2.5}),
                       dict(sequence_bias={(eos,): 3.0, (32,): 2.5})),
    }


def _early_eos(target, prompts) -> int:
    """A token that target-only greedy decoding of `prompts` emits early (so min_new_tokens must hold it back)."""
    out = Engine(target, impl="reference").generate(prompts, SamplingParams(max_new_tokens=6))
    return out[0].token_ids[2]


@pytest.mark.parametrize("case", ["repetition 1.1", "repetition 1.5", "repetition 0.8", "min_new_tokens",
                                  "logit_bias"])
def test_target_only_equals_transformers_generate(small, case):
    hf = _hf_model(small.path / "target")
    prompts = heldout_prompts(2, 40, seed=3)
    sp, kw = _hf_cases(_early_eos(small.target, prompts))[case]
    want = [_hf_greedy(hf, p, sp.max_new_tokens, **kw) for p in prompts]
    assert [o.token_ids for o in Engine(small.target, impl="reference").generate(prompts, sp)] == want


def _check_worker_against_hf(bundle, name, case, impl, prompts, spec=None, max_new_tokens=None):
    """spec, max_new_tokens: instead of the worker's shape and the case's length."""
    hf = _hf_model(bundle.path / "target")
    sp, kw = _hf_cases(_early_eos(bundle.target, prompts))[case]
    if max_new_tokens is not None:
        sp = dataclasses.replace(sp, max_new_tokens=max_new_tokens)
    want = [_hf_greedy(hf, p, sp.max_new_tokens, **kw) for p in prompts]
    kind, default_spec = WORKERS[name]
    outs = Engine(bundle.target, getattr(bundle, kind), spec or default_spec, impl=impl).generate(prompts, sp)
    assert [o.token_ids for o in outs] == want
    return outs


@pytest.mark.parametrize("name", CI_WORKERS)
@pytest.mark.parametrize("case", ["repetition 1.5", "min_new_tokens", "logit_bias"])
def test_workers_equal_transformers_generate(small, name, case):
    outs = _check_worker_against_hf(small, name, case, "reference", heldout_prompts(2, 40, seed=3))
    assert sum(a for o in outs for a in o.accept_lens) > 1.5 * sum(len(o.accept_lens) for o in outs)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WORKERS))
@pytest.mark.parametrize("case", ["repetition 1.1", "repetition 1.5", "repetition 0.8", "min_new_tokens",
                                  "logit_bias"])
@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_every_worker_equals_transformers_generate_full_grid(small, name, case, impl):
    _check_worker_against_hf(small, name, case, impl, heldout_prompts(2, 40, seed=3))


def test_the_fast_workers_equal_transformers_generate(small):
    """The interpreted fast path pays per kernel program: a smaller tree and a shorter output than the reference's
    cases (the full grid, both paths, runs with -m slow)."""
    outs = _check_worker_against_hf(small, "EAGLE tree S5 K4 W16", "repetition 1.5", "fast",
                                    heldout_prompts(1, 32, seed=4), spec=SpecConfig(3, 2, 6), max_new_tokens=12)
    assert max(a for o in outs for a in o.accept_lens) > 2  # the tree's deeper nodes were accepted


@pytest.mark.parametrize("family", ["llama", pytest.param("qwen2", marks=pytest.mark.slow)])
def test_random_targets_equal_transformers_generate(tmp_path, family):
    """Random Llama / Qwen2 targets written by transformers, target-only and an EAGLE tree with a random head."""
    transformers = pytest.importorskip("transformers")
    cls, cfg_cls = ((transformers.LlamaForCausalLM, transformers.LlamaConfig) if family == "llama"
                    else (transformers.Qwen2ForCausalLM, transformers.Qwen2Config))
    cfg = cfg_cls(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    hf = cls(cfg).eval()
    hf.save_pretrained(tmp_path)
    from specdec.models import LlamaForCausalLM
    target = LlamaForCausalLM.from_pretrained(tmp_path)
    prompts = [[5, 9, 5, 9, 5, 1], [7, 7, 3]]
    for rp in (1.5, 0.8):
        want = [_hf_greedy(hf, p, 12, repetition_penalty=rp) for p in prompts]
        sp = SamplingParams(max_new_tokens=12, repetition_penalty=rp)
        for draft, spec in ((None, None), (random_eagle_head(target, seed=1), SpecConfig(3, 2, 6)),
                            (random_mtp(target, 2, True, seed=1), SpecConfig(2))):
            outs = Engine(target, draft, spec, impl="reference").generate(prompts, sp)
            assert [o.token_ids for o in outs] == want, (rp, type(draft).__name__)


PLAIN_CASES = {
    "frequency": SamplingParams(max_new_tokens=16, frequency_penalty=1.2, return_logprob=True),
    "presence": SamplingParams(max_new_tokens=16, presence_penalty=-0.7, return_logprob=True),
    "all": SamplingParams(max_new_tokens=16, frequency_penalty=0.6, presence_penalty=0.9, repetition_penalty=1.3,
                          min_new_tokens=5, stop_token_ids=[3], logit_bias={4: 1.0}, return_logprob=True),
}


@pytest.mark.parametrize("case", list(PLAIN_CASES))
@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_frequency_and_presence_equal_plain_decoding_by_hand(case, kind):
    """Against a loop written here: one full forward per token, no cache, the penalties applied in float64. A
    near-bigram target with bigram-perfect drafts, so that drafts are accepted deep into the tree."""
    target = near_bigram_target(seed=5, mix=0.3, vocab_size=64)
    draft, spec = {"target-only": (None, None), "eagle": (perfect_eagle(target), SpecConfig(4, 2, 8)),
                   "mtp": (perfect_mtp(target, 3, False), SpecConfig(3))}[kind]
    sp = PLAIN_CASES[case]
    prompts = [[1, 2, 3, 1, 2], [9, 9, 9], [4]]
    outs = Engine(target, draft, spec, impl="reference").generate(prompts, sp)
    for p, o in zip(prompts, outs):
        tokens, logprobs = penalised_greedy_decode(target, p, sp)
        assert o.token_ids == tokens
        assert max(abs(a - b) for a, b in zip(o.logprobs, logprobs)) <= LOGPROB_ATOL
    if draft is not None:
        assert any(a > 2 for o in outs for a in o.accept_lens)


def _repeating_pair():
    """A bigram target whose logits after token s are exactly 3 * [t == s] - 0.1 * t: the greedy choice after s is
    s again, by 3 - 0.1 s. With frequency_penalty=2 plain decoding repeats a token once and then moves on (s < 10),
    and a bigram-perfect EAGLE head always proposes the repeat: the depth-1 draft is accepted, the depth-2 one must
    be judged with s counted twice."""
    V, H = 16, 32
    target = bigram_target(seed=3, vocab_size=V, hidden_size=H)
    basis = torch.eye(H)
    alpha, beta = 4.0, 1.0
    rms = ((alpha ** 2 + beta ** 2) / H) ** 0.5
    with torch.no_grad():
        target.model.embed_tokens.weight.copy_(alpha * basis[:V] + beta * basis[H - 1])
        target.model.norm.weight.fill_(1.0)
        target.lm_head.weight.copy_(3.0 * basis[:V] * rms / alpha
                                    - 0.1 * torch.arange(V, dtype=torch.float32)[:, None] * basis[H - 1] * rms / beta)
    return target


def test_sglang_mode_differs_where_exact_does_not():
    """A token accepted at depth 1 must be penalised at depth 2: under penalty_mode="sglang" it is not, and the
    output leaves target-only's; the exact mode stays equal to it (so this test of the difference can fail)."""
    target = _repeating_pair()
    draft = perfect_eagle(target)
    sp = SamplingParams(max_new_tokens=12, frequency_penalty=2.0)
    prompts = [[5], [8, 2]]
    base = Engine(target, impl="reference").generate(prompts, sp)
    by_hand = [penalised_greedy_decode(target, p, sp)[0] for p in prompts]
    assert [o.token_ids for o in base] == by_hand
    exact = Engine(target, draft, SpecConfig(3, 1), impl="reference").generate(prompts, sp)
    approx = Engine(target, draft, SpecConfig(3, 1, penalty_mode="sglang"), impl="reference").generate(prompts, sp)
    assert [o.token_ids for o in exact] == by_hand
    assert [o.token_ids for o in approx] != by_hand


@pytest.mark.parametrize("name", ["EAGLE chain S3", "EAGLE tree S5 K4 W16", "MTP MiMo S3",
                                  pytest.param("MTP Step-3.5 S3", marks=pytest.mark.slow)])
def test_draft_penalties_change_only_the_proposals(small, name):
    """SpecConfig(draft_penalties=True): the drafts propose along their own penalised paths. The output stays
    target-only's, and under a strong frequency penalty more drafts are accepted (measured on the shipped pair:
    chain S3 2.30 -> 3.06, MTP MiMo 2.28 -> 2.98 tokens per step)."""
    prompts = heldout_prompts(6, 48, seed=3)
    sp = SamplingParams(max_new_tokens=40, frequency_penalty=1.0, presence_penalty=0.5)
    base = [o.token_ids for o in Engine(small.target, impl="reference").generate(prompts, sp)]
    kind, spec = WORKERS[name]
    accepted = []
    for draft_penalties in (False, True):
        engine = Engine(small.target, getattr(small, kind), dataclasses.replace(spec, draft_penalties=draft_penalties),
                        impl="reference")
        outs = engine.generate(prompts, sp)
        assert [o.token_ids for o in outs] == base
        accepted.append(engine.last_stats.mean_accept_len)
    assert accepted[1] > accepted[0], accepted


def test_draft_penalties_on_the_fast_path(small):
    prompts = heldout_prompts(1, 32, seed=5)
    sp = SamplingParams(max_new_tokens=10, repetition_penalty=1.5, return_logprob=True)  # interpreted: kept short
    base = Engine(small.target, impl="reference").generate(prompts, sp)
    outs = Engine(small.target, small.eagle, SpecConfig(3, 2, 6, draft_penalties=True), impl="fast").generate(
        prompts, sp)
    assert_same_as_baseline(outs, base)


def test_penalty_mode_is_checked():
    with pytest.raises(ValueError, match="penalty_mode must be 'exact' or 'sglang', got 'sgl'"):
        SpecConfig(3, penalty_mode="sgl")


# ---- sampling, logprobs, ragged batches, graphs -----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["eagle", pytest.param("mtp_chain", marks=pytest.mark.slow)])
def test_sampling_under_penalties_is_the_exact_distribution(kind):
    """The first three tokens sampled at T = 0.9 with frequency 1.0 and repetition 1.6 (which change the law):
    chi-square against the exact joint law by enumeration."""
    V, N = 6, 3000
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_attention_heads=2, init_std=0.3)
    draft, spec = ((perfect_eagle(target), SpecConfig(2, 2, 4)) if kind == "eagle"
                   else (perfect_mtp(target, 2, True), SpecConfig(2)))
    prompt = [1, 2]
    sp = SamplingParams(max_new_tokens=3, temperature=0.9, frequency_penalty=1.0, repetition_penalty=1.6)
    exact = target_law(target, prompt, 3, sp)
    plain = target_law(target, prompt, 3, SamplingParams(temperature=0.9))
    assert max(abs(exact.get(k, 0.0) - plain.get(k, 0.0)) for k in exact | plain) > 0.02  # the penalties matter
    outs = Engine(target, draft, spec, impl="reference", max_batch=N, max_seq_len=12).generate(
        [prompt] * N, sp, seed=11)
    counts = dict.fromkeys(exact, 0)
    for o in outs:
        counts[tuple(o.token_ids)] += 1
    assert any(a > 1 for o in outs for a in o.accept_lens)
    assert chi_square_pvalue(counts, exact) > FALSE_FAILURE_RATE


# the fast path under penalties is CI's in test_draft_penalties_on_the_fast_path and
# test_the_fast_workers_equal_transformers_generate; this batch on the interpreted fast path (3 minutes) with -m slow
@pytest.mark.parametrize("impl", ["reference", pytest.param("fast", marks=pytest.mark.slow)])
def test_a_ragged_batch_mixing_penalties_and_none(small, impl):
    """Some requests with penalties, some without, one stopping inside an accepted window: each equals its own
    target-only run, logprobs included."""
    prompts = heldout_prompts(4, 40, seed=8)
    eos = _early_eos(small.target, prompts[:1])
    params = [SamplingParams(max_new_tokens=18, repetition_penalty=1.4, return_logprob=True, top_logprobs_num=2),
              SamplingParams(max_new_tokens=9, return_logprob=True, top_logprobs_num=2),
              SamplingParams(max_new_tokens=18, stop_token_ids=[eos], return_logprob=True, top_logprobs_num=2,
                             frequency_penalty=0.5),
              SamplingParams(max_new_tokens=18, min_new_tokens=7, stop_token_ids=[eos], logit_bias={eos: 2.0},
                             return_logprob=True, top_logprobs_num=2)]
    base = [Engine(small.target, impl="reference").generate([p], [sp])[0] for p, sp in zip(prompts, params)]
    assert any(o.finish_reason == "stop" for o in base)
    outs = Engine(small.target, small.eagle, SpecConfig(5, 4, 16), impl=impl).generate(prompts, params)
    assert_same_as_baseline(outs, base)


def test_the_graph_body_carries_the_counts(small):
    """DecodeGraphs' static buffers (eager, so on any device) give what plain steps give when some requests are
    penalised: the counts and the penalty parameters travel through them, requests leave mid-way (the
    buckets change, the penalty tensors are filtered), and the penalised body gets its own entry."""
    prompts = heldout_prompts(3, 32, seed=9)
    params = [SamplingParams(max_new_tokens=14, repetition_penalty=1.5, return_logprob=True),
              SamplingParams(max_new_tokens=5, return_logprob=True),
              SamplingParams(max_new_tokens=9, frequency_penalty=1.0, presence_penalty=0.5, return_logprob=True)]
    base = Engine(small.target, small.eagle, SpecConfig(3, 2, 6), impl="reference", max_batch=4).generate(
        prompts, params)
    engine = Engine(small.target, small.eagle, SpecConfig(3, 2, 6), impl="reference", max_batch=4)
    graphs = DecodeGraphs(engine.worker, capture=False)
    engine._decode = graphs.decode_step
    assert_same_as_baseline(engine.generate(prompts, params), base)
    assert any(key[-1] for key in graphs.entries) and len({key[0] for key in graphs.entries}) > 1
