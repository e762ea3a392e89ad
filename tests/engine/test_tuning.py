"""Tuned and adaptive speculation (`specdec.tuning`, `specdec tune`): shapes switch between steps and the output stays
target-only decoding's; a tuned file is checked against the pair and its fields at the engine's boundary."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig, zoo
from specdec.ops.contract import NO_DRAFT
from specdec.models.bigram import near_bigram_target
from specdec.models.eagle import random_eagle_head
from specdec.tuning import AdaptiveShapes, Bucket, Candidate, TunedSpec, fingerprint, parameters_entry
from tests.helpers import (FALSE_FAILURE_RATE, CyclingSpec, assert_same_as_baseline, chi_square_pvalue,
                           logprob_params)
from specdec.lab import target_law


def tuned_for(target, draft, buckets: dict, adaptive=False, kind="eagle") -> TunedSpec:
    """A tuned spec written by hand: buckets maps a batch size to (best shape, [(shape, accept, step_ms), ...])."""
    return TunedSpec({"name": "test", "fingerprint": fingerprint(target)},
                     {"kind": kind, "fingerprint": fingerprint(draft), **parameters_entry(draft)}, {},
                     {b: Bucket(best, tuple(Candidate(*c) for c in cands)) for b, (best, cands) in buckets.items()},
                     adaptive=adaptive)


def test_a_batch_takes_the_bucket_nearest_its_size_by_ratio():
    """Tuned at 1 and 16, a batch of 2 or 3 runs the B = 1 shape and 4 to 16 (and more) the B = 16 one; a tie of
    ratios (4 between 1 and 16, 2 between 1 and 4) goes to the bigger bucket."""
    chain, tree = (3, 1, 4), (5, 4, 16)
    two = TunedSpec({}, {}, {}, {1: Bucket(tree, (Candidate(tree, 4.0, 30.0),)),
                                 16: Bucket(chain, (Candidate(chain, 3.0, 60.0),))})
    assert [two.bucket(b).shape for b in (1, 2, 3, 4, 5, 8, 16, 64)] == [tree] * 3 + [chain] * 5
    mid = (4, 2, 8)
    three = TunedSpec({}, {}, {}, {1: Bucket(tree, (Candidate(tree, 4.0, 30.0),)),
                                   4: Bucket(mid, (Candidate(mid, 3.5, 40.0),)),
                                   16: Bucket(chain, (Candidate(chain, 3.0, 60.0),))})
    assert [three.bucket(b).shape for b in (1, 2, 3, 5, 7, 8, 9, 32)] == [tree, mid, mid, mid, mid, chain, chain,
                                                                          chain]


@pytest.fixture(scope="module")
def pair():
    b = zoo.load("stdlib-byte-6l")
    prompts = [b.tokenizer.encode(t) for t in ("def fibonacci(n):\n", "import os\nclass ", "The weather was",
                                                "    for i in range(")]
    return b, prompts


#: three shapes and no draft, the no-draft step priced so that a request whose drafts fail falls back to it
CANDIDATES = [((5, 4, 16), 4.0, 3.0), ((3, 1, 4), 3.0, 1.6), ((2, 2, 4), 2.5, 1.4), (NO_DRAFT, 1.0, 0.9)]


@pytest.mark.parametrize("adaptive", [False, True], ids=["tuned", "adaptive"])
def test_tuned_and_adaptive_decoding_equal_target_only(pair, tmp_path, adaptive):
    b, prompts = pair
    tuned = tuned_for(b.target, b.eagle, {1: ((3, 1, 4), CANDIDATES), 4: ((2, 2, 4), CANDIDATES)}, adaptive)
    path = tuned.save(tmp_path / "tuned.json")
    params = logprob_params(max_new=24)
    base = Engine(b.target).generate(prompts, params)
    engine = Engine(b.target, b.eagle, f"{'adaptive' if adaptive else 'tuned'}:{path}", max_batch=4)
    assert_same_as_baseline(engine.generate(prompts, params), base)
    shapes = engine.last_stats.step_shapes
    if adaptive:  # every step ran one of the bucket's candidates (the switching itself: the tests below)
        assert set(shapes) <= {c[0] for c in CANDIDATES}
    else:  # the batch of 4 runs bucket 4's shape until requests finish; a batch of 1 runs bucket 1's
        assert shapes[0] == (2, 2, 4)
        for p, o in zip(prompts[:2], base[:2]):
            assert engine.generate([p], params)[0].token_ids == o.token_ids
            assert set(engine.last_stats.step_shapes) == {(3, 1, 4)}


def test_a_bucket_tuned_to_no_draft_decodes_target_only_steps(pair):
    """Where the tuner measured no shape beating no draft (a large batch on a CPU), the bucket's shape is no draft:
    its batches run one-node steps, a smaller batch drafts with its own bucket's shape, and the output is
    target-only's; a file whose every bucket is no draft runs no drafting step at all."""
    b, prompts = pair
    params = logprob_params(max_new=24)
    base = Engine(b.target).generate(prompts, params)
    engine = Engine(b.target, b.eagle, tuned_for(b.target, b.eagle, {1: ((3, 1, 4), CANDIDATES),
                                                                     4: (NO_DRAFT, CANDIDATES)}), max_batch=4)
    assert_same_as_baseline(engine.generate(prompts, params), base)
    assert engine.last_stats.step_shapes[0] == NO_DRAFT and set(engine.last_stats.step_shapes) <= {NO_DRAFT, (3, 1, 4)}
    assert engine.generate(prompts[:1], params)[0].token_ids == base[0].token_ids
    assert set(engine.last_stats.step_shapes) == {(3, 1, 4)}
    never = Engine(b.target, b.eagle, tuned_for(b.target, b.eagle, {4: (NO_DRAFT, CANDIDATES)}), max_batch=4)
    assert_same_as_baseline(never.generate(prompts, params), base)
    assert set(never.last_stats.step_shapes) == {NO_DRAFT}
    assert never.last_stats.mean_accept_len == 1.0


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "draft_lm"])
def test_every_switch_between_allowed_shapes_is_lossless(pair, kind):
    """The worker contract adaptive speculation rests on: whatever allowed shape each step runs (no draft, chains,
    trees of several topk), the tokens and logprobs are target-only's, for every kind EagleWorkerV2 runs (the EAGLE
    and EAGLE-3 heads, STANDALONE's draft LM, whose cache runs one position ahead)."""
    b, prompts = pair
    draft = getattr(b, kind)
    params = logprob_params(max_new=20)
    base = Engine(b.target).generate(prompts, params)
    cycle = [(5, 4, 16), NO_DRAFT, (3, 1, 4), (2, 2, 4), NO_DRAFT, NO_DRAFT, (4, 4, 8)]
    tuned = tuned_for(b.target, draft, {4: ((5, 4, 16), [(s, 2.0, 1.0) for s in cycle])}, adaptive=True, kind=kind)
    engine = Engine(b.target, draft, tuned, max_batch=4)

    engine.tuned = CyclingSpec(cycle)
    out = engine.generate(prompts, params)
    assert_same_as_baseline(out, base)
    assert len(engine.last_stats.step_shapes) >= len(cycle)
    assert any(a > 3 for o in out for a in o.accept_lens)  # the trees accepted deep paths


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "draft_lm"])
@pytest.mark.parametrize("skipped", [1, 3, 10])
def test_after_no_draft_steps_the_draft_is_where_a_prefill_of_the_whole_text_puts_it(pair, kind, skipped):
    """NO_DRAFT steps skip the draft extend, and the next drafting step catches up on them in one extend (10 skipped
    steps cross `max_skipped_steps`, set to 4 here, twice: a full buffer is caught up on between two NO_DRAFT steps,
    and the next drafting step catches up on the 2 left). Oracle: a fresh worker prefilled with the whole committed
    text (the ragged prompts, the first token and every decoded token but the last, which the greedy prefill samples
    again): the next root's K children and their probabilities, the draft's hidden state there, and so the next
    draft tree, must be the same."""
    b, prompts = pair
    draft = getattr(b, kind)
    cands = [((3, 1, 4), 3.0, 1.6), (NO_DRAFT, 1.0, 0.9)]
    worker = Engine(b.target, draft, tuned_for(b.target, draft, {4: ((3, 1, 4), cands)}, adaptive=True, kind=kind),
                    max_batch=4).worker
    worker.max_skipped_steps = 4
    params = [SamplingParams(max_new_tokens=32)] * len(prompts)
    tokens = [worker.prefill(prompts, params, seed=0).predict.tolist()]
    for _ in range(skipped):
        worker.use_shape(NO_DRAFT)
        tokens.append(worker.decode_step().predict.tolist())
    worker.use_shape((3, 1, 4))
    worker.prepare_decode()  # the catch-up
    assert worker.skipped_steps == 0
    caught_up = worker.state
    worker.finish()

    fresh = Engine(b.target, draft, SpecConfig(3, 1, 4), max_batch=4).worker
    texts = [p + [t[i] for t in tokens[:-1]] for i, p in enumerate(prompts)]
    assert fresh.prefill(texts, params, seed=0).predict.tolist() == tokens[-1]
    assert torch.equal(fresh.state.topk_index, caught_up.topk_index)
    torch.testing.assert_close(fresh.state.topk_p, caught_up.topk_p, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fresh.state.draft_hidden, caught_up.draft_hidden, rtol=1e-4, atol=1e-5)
    fresh.finish()


def test_every_switch_between_ngram_shapes_is_lossless(pair):
    """NgramWorker switches shapes as EagleWorkerV2 does: chains, trees of two match types and no draft at all in
    turn, each step a request's tokens and logprobs stay target-only's."""
    from specdec.models.ngram import NgramDraft
    b, prompts = pair
    params = logprob_params(max_new=24)
    base = Engine(b.target).generate(prompts, params)
    cycle = [(6, 4, 16), NO_DRAFT, (3, 1, 4), (8, 2, 8), NO_DRAFT, (2, 2, 4)]
    for draft in (NgramDraft(), NgramDraft(match_type="PROB")):
        tuned = tuned_for(b.target, draft, {4: ((6, 4, 16), [(s, 2.0, 1.0) for s in cycle])}, adaptive=True,
                          kind="ngram")
        engine = Engine(b.target, draft, tuned, max_batch=4)
        engine.tuned = CyclingSpec(cycle)
        out = engine.generate(prompts, params)
        assert_same_as_baseline(out, base)
        assert set(engine.last_stats.step_shapes) == set(cycle)
        assert any(a > 1 for o in out for a in o.accept_lens)
    unfillable = tuned_for(b.target, NgramDraft(max_bfs_breadth=2), {1: ((3, 1, 4), [((2, 4, 12), 2.0, 1.0)])},
                           adaptive=True, kind="ngram")
    with pytest.raises(ValueError, match=r"candidates\[0\]\.shape S2 K4 W12 cannot run on this draft: "
                                         r"num_draft_tokens=12 cannot be filled"):
        Engine(b.target, NgramDraft(max_bfs_breadth=2), unfillable)
    with pytest.raises(ValueError, match=r"draft\.fingerprint .* is not this draft's"):  # other parameters
        Engine(b.target, NgramDraft(max_bfs_breadth=3), tuned_for(b.target, NgramDraft(), {1: ((3, 1, 4), [])},
                                                                  kind="ngram"))


def test_the_tuner_tunes_an_ngram_draft(pair):
    """`tune` on NGRAM (no model: the trie's host work is the draft step) chooses among measured shapes, and decoding
    with what it chose repeats target-only."""
    from specdec.bench.tune.search import tune
    from specdec.models.ngram import NgramDraft
    b, prompts = pair
    draft = NgramDraft()
    tuned, rows, _ = tune(b.target, draft, prompts, [1, 2], max_new_tokens=8, shapes=[(2, 1, 3), (4, 1, 5), (3, 2, 6)],
                          confirm=2, model_name="stdlib-byte-6l", progress=lambda *a: None)
    assert tuned.draft["kind"] == "ngram"
    for size, bucket in tuned.buckets.items():
        assert bucket.shape in [(r.num_steps, r.topk, r.num_draft_tokens) for r in rows
                                if r.batch_size == size and r.source == "confirm" and r.chosen]
    params = logprob_params(max_new=16)
    base = Engine(b.target).generate(prompts, params)
    for spec in (tuned, tuned.with_adaptive()):
        assert_same_as_baseline(Engine(b.target, draft, spec, max_batch=4).generate(prompts, params), base)


@pytest.mark.parametrize("temperature, top_k", [(1.0, -1), (0.8, 3)])
def test_adaptive_sampling_follows_the_target_distribution(temperature, top_k):
    """Sampling through adaptive speculation, its shape moving with the batch's acceptance (no draft among them):
    the emitted sequences follow the target's exact joint law (chi-square)."""
    V = 6
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=V, hidden_size=16, num_hidden_layers=2)
    head = random_eagle_head(target, seed=4, std=1.0)
    cands = [((2, 1, 3), 3.0, 1.0), ((2, 2, 4), 2.6, 1.1), (NO_DRAFT, 1.0, 0.45)]
    tuned = tuned_for(target, head, {4096: ((2, 1, 3), cands)}, adaptive=True)
    # a fast EMA, so that the shape moves within the three decode steps this law can afford
    object.__setattr__(tuned, "policy", lambda: AdaptiveShapes(tuned, decay=0.5))
    prompt, n_tokens, N = [1, 2], 4, 4000
    params = SamplingParams(max_new_tokens=n_tokens, temperature=temperature, top_k=top_k)
    engine = Engine(target, head, tuned, impl="reference", max_batch=N, max_seq_len=12)
    outs = engine.generate([prompt] * N, params, seed=7)
    assert len(set(engine.last_stats.step_shapes)) > 1
    counts = Counter(tuple(o.token_ids) for o in outs)
    assert chi_square_pvalue(counts, target_law(target, prompt, n_tokens, params)) > FALSE_FAILURE_RATE


def test_the_adaptive_policy_falls_back_to_no_draft_and_probes(pair):
    """Requests whose drafts keep failing (an EAGLE head that never guesses right) end up mostly undrafted, with a
    drafting probe every `probe_every` steps; requests whose drafts are accepted keep drafting."""
    from tests.helpers import always_wrong_eagle
    b, prompts = pair
    params = SamplingParams(max_new_tokens=40)
    wrong = always_wrong_eagle(b.target)
    cands = [((3, 1, 4), 3.0, 1.6), (NO_DRAFT, 1.0, 0.9)]
    engine = Engine(b.target, wrong, tuned_for(b.target, wrong, {4: ((3, 1, 4), cands)}, adaptive=True), max_batch=4)
    base = Engine(b.target).generate(prompts[:1], params)
    out = engine.generate(prompts[:1], params)
    assert out[0].token_ids == base[0].token_ids
    shapes = engine.last_stats.step_shapes
    assert shapes[0] == (3, 1, 4)  # tried first
    # q falls by the EMA's factor (1 - 0.25) per failed step; (1 + 2q) / 1.6 < 1 / 0.9 from q < 0.39: four steps
    given_up = shapes.index(NO_DRAFT)
    assert given_up == 4 and shapes[:given_up] == [(3, 1, 4)] * given_up
    rest = shapes[given_up:]  # then undrafted, but for one probe after every probe_every undrafted steps
    assert rest.count((3, 1, 4)) == len(rest) // 5 and all(s == NO_DRAFT for s in rest[:4])
    good = Engine(b.target, b.eagle, tuned_for(b.target, b.eagle, {4: ((3, 1, 4), cands)}, adaptive=True),
                  max_batch=4)
    good.generate(prompts[:1], params)
    assert good.last_stats.step_shapes.count((3, 1, 4)) > len(good.last_stats.step_shapes) / 2


def test_a_noisy_dip_does_not_stop_a_request_whose_drafts_pay():
    """The policy alone, fed accepted lengths by hand. A request whose drafts run at q = 0.6 on average (above the
    no-draft boundary q < 0.39 of these candidates) meets three failed steps in a row: its EMA falls to 0.27, but
    its mean over all its drafted steps stays above the boundary, so it keeps drafting. A request whose drafts
    always fail still gives up after four steps, as the EMA alone made it."""
    cands = (Candidate((3, 1, 4), 3.0, 1.6), Candidate(NO_DRAFT, 1.0, 0.9))
    spec = TunedSpec({}, {}, {}, {1: Bucket((3, 1, 4), cands)}, adaptive=True)
    noisy = AdaptiveShapes(spec)
    noisy.start(1)
    for accepted in [3, 2, 3, 2, 3, 1, 1, 1]:  # q = 1, 0.5, 1, 0.5, 1, then 0, 0, 0
        assert noisy.choose(1) == (3, 1, 4)
        noisy.observe([accepted])
    assert noisy.quality[0] < 0.39 < noisy.mean_quality()[0]  # the EMA alone would stop drafting here
    assert noisy.choose(1) == (3, 1, 4)
    failing = AdaptiveShapes(spec)
    failing.start(1)
    chosen = []
    for _ in range(6):
        chosen.append(failing.choose(1))
        failing.observe([1])
    assert chosen == [(3, 1, 4)] * 4 + [NO_DRAFT] * 2


def test_adaptive_leaves_the_tuned_shape_only_for_one_predicted_a_margin_faster():
    """The policy alone. The tuned chain S3 (3.0 tokens in 1.6 ms: 1.875 a ms) against a chain S5 predicted 3 %
    faster (4.12 in 2.12 ms: 1.943) stays; against one predicted 10 % faster (4.5 in 2.18 ms: 2.064) it leaves. A
    request whose drafts all fail still leaves both for no draft."""
    def policy(s5_accept, s5_ms, margin=0.06):
        cands = (Candidate((3, 1, 4), 3.0, 1.6), Candidate((5, 1, 6), s5_accept, s5_ms), Candidate(NO_DRAFT, 1.0, 0.9))
        p = AdaptiveShapes(TunedSpec({}, {}, {}, {1: Bucket((3, 1, 4), cands)}, adaptive=True), margin=margin)
        p.start(1)
        return p

    near = policy(4.12, 2.12)
    assert near.choose(1) == (3, 1, 4)
    assert policy(4.12, 2.12, margin=0.0).choose(1) == (5, 1, 6)  # what the policy did before the margin
    assert policy(4.5, 2.18).choose(1) == (5, 1, 6)
    chosen = []
    for _ in range(6):
        chosen.append(near.choose(1))
        near.observe([1])
    assert chosen[0] == (3, 1, 4) and chosen[-1] == NO_DRAFT


# ---- the boundary ------------------------------------------------------------------------------

NO_DRAFT_SHAPE = dict(num_steps=0, topk=0, num_draft_tokens=1)


def _write(tmp_path, data) -> str:
    path = tmp_path / "tuned.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_a_corrupt_or_incomplete_file_is_one_line_naming_the_field(pair, tmp_path):
    b, _ = pair
    good = tuned_for(b.target, b.eagle, {1: ((3, 1, 4), CANDIDATES)}).to_dict()
    with pytest.raises(ValueError, match=r"not JSON \(.* at line 1"):
        Engine(b.target, b.eagle, "tuned:" + _write(tmp_path, '{"format": "specdec-tuned/1", '))
    cases = [
        (lambda d: d.pop("buckets"), r"buckets is missing"),
        (lambda d: d.update(format="v0"), r"format must be 'specdec-tuned/1'"),
        (lambda d: d["buckets"]["1"]["candidates"][1].update(step_ms="fast"),
         r"buckets\['1'\]\.candidates\[1\]\.step_ms must be a positive number"),
        (lambda d: d["buckets"]["1"]["shape"].update(num_draft_tokens=9),
         r"buckets\['1'\]\.shape is no legal shape: num_draft_tokens=9 must be in \[2, "),
        (lambda d: d["buckets"]["1"]["shape"].pop("topk"), r"buckets\['1'\]\.shape\.topk is missing"),
        (lambda d: d["buckets"].update({"0": d["buckets"]["1"]}), r"buckets\['0'\] must be keyed by a batch size"),
        (lambda d: d["buckets"]["1"].update(shape={"num_steps": 4, "topk": 1, "num_draft_tokens": 5}),
         r"buckets\['1'\]\.shape S4 K1 W5 must be one of the bucket's candidates"),
        (lambda d: d["draft"].pop("fingerprint"), r"draft\.fingerprint is missing"),
        (lambda d: d["buckets"]["1"].update(shape=NO_DRAFT_SHAPE, candidates=[dict(shape=NO_DRAFT_SHAPE,
                                                                                    mean_accept_len=1, step_ms=1)]),
         r"buckets hold no drafting shape"),
    ]
    for edit, message in cases:
        data = json.loads(json.dumps(good))
        edit(data)
        with pytest.raises(ValueError, match=message) as e:
            Engine(b.target, b.eagle, "tuned:" + _write(tmp_path, data))
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"cannot be read"):
        Engine(b.target, b.eagle, f"tuned:{tmp_path / 'missing.json'}")
    with pytest.raises(ValueError, match=r"'tuned:PATH' or 'adaptive:PATH', got 'fast:x'"):
        Engine(b.target, b.eagle, "fast:x")


def test_a_file_of_another_pair_or_a_shape_the_draft_cannot_run_is_refused(pair, tmp_path):
    b, _ = pair
    deep = zoo.load("stdlib-byte-24l")
    other = _write(tmp_path, tuned_for(deep.target, deep.eagle, {1: ((3, 1, 4), CANDIDATES)}).to_dict())
    with pytest.raises(ValueError, match=r"target\.fingerprint .* \(test\) is not this target's"):
        Engine(b.target, b.eagle, "tuned:" + other)
    eagle3 = tuned_for(b.target, b.eagle3, {1: ((3, 1, 4), CANDIDATES)}, kind="eagle3")
    with pytest.raises(ValueError, match=r"draft\.kind is 'eagle3', but the draft given is of kind 'eagle'"):
        Engine(b.target, b.eagle, eagle3)
    wide = tuned_for(b.target, b.eagle, {1: ((3, 1, 4), CANDIDATES + [((2, 300, 400), 2.0, 1.0)])}, adaptive=True)
    with pytest.raises(ValueError, match=r"buckets\['1'\]\.candidates\[4\]\.shape S2 K300 W400 cannot run on this "
                                         r"draft: topk=300 exceeds the draft's vocabulary of 258 ids"):
        Engine(b.target, b.eagle, wide)
    mtp = tuned_for(b.target, b.mtp, {1: ((3, 1, 4), CANDIDATES)}, kind="mtp")
    with pytest.raises(ValueError, match=r"runs on MultiLayerEagleWorkerV2, which keeps one shape"):
        Engine(b.target, b.mtp, mtp)
    with pytest.raises(ValueError, match=r"a tuned spec needs the draft"):
        Engine(b.target, None, tuned_for(b.target, b.eagle, {1: ((3, 1, 4), CANDIDATES)}))


def test_the_confirm_step_measures_every_chain_whatever_its_rank():
    """The cost model ranked the deep pair's chain S3 below the trees of its depth at B = 16, where the grid found
    it best: the confirm step takes the best predicted, the best of each topk and each depth, no draft, and every
    chain, even one ranked last."""
    from specdec.bench.tune.search import confirm_candidates
    ranked = [(3, 4, 8), (4, 4, 12), (4, 1, 5), (3, 2, 6), (2, 4, 6), NO_DRAFT, (2, 1, 3), (3, 1, 4)]
    got = confirm_candidates(ranked, confirm=2)
    assert got[:2] == [(3, 4, 8), (4, 4, 12)]  # the best predicted first
    assert set(got) == {(3, 4, 8), (4, 4, 12), (4, 1, 5), (3, 2, 6), (2, 4, 6), (2, 1, 3), (3, 1, 4), NO_DRAFT}
    assert got[-1] == NO_DRAFT and len(got) == len(set(got))
    assert confirm_candidates([(3, 4, 8), (3, 1, 4), NO_DRAFT], confirm=1) == [(3, 4, 8), (3, 1, 4), NO_DRAFT]


def test_the_tuner_writes_a_file_the_engine_decodes_with(pair, tmp_path):
    """`specdec tune` end to end on the small pair (a few shapes, short decodes): the file loads, names the pair,
    its choices are measured candidates, and decoding with it (tuned and adaptive) repeats target-only."""
    from specdec.bench.tune.search import candidate_shapes, tune
    b, prompts = pair
    shapes = candidate_shapes(max_steps=2, topks=(1, 2), widths=(4,))
    tuned, rows, _ = tune(b.target, b.eagle, prompts, [1, 2], max_new_tokens=8, shapes=shapes, confirm=2,
                          model_name="stdlib-byte-6l", progress=lambda *a: None)
    path = tuned.save(tmp_path / "t.json")
    loaded = TunedSpec.load(path)
    assert loaded.buckets.keys() == {1, 2} and loaded.draft["kind"] == "eagle"
    for size, bucket in loaded.buckets.items():
        confirmed = [r for r in rows if r.batch_size == size and r.source == "confirm"]
        assert bucket.shape in [(r.num_steps, r.topk, r.num_draft_tokens) for r in confirmed if r.chosen]
        assert NO_DRAFT in [c.shape for c in bucket.candidates]
    assert {(r.num_steps, r.topk, r.num_draft_tokens) for r in rows if r.source == "acceptance"} == {*shapes,
                                                                                                      NO_DRAFT}
    params = logprob_params(max_new=16)
    base = Engine(b.target).generate(prompts, params)
    for spec in (loaded, loaded.with_adaptive()):
        assert_same_as_baseline(Engine(b.target, b.eagle, spec, max_batch=4).generate(prompts, params), base)


def _emptying_batch_ms(steps, one_ms, full_ms, B):
    """Step by step: a batch whose requests take `steps` decode steps, a step of b requests costing
    one_ms + (b - 1) / (B - 1) (full_ms - one_ms)."""
    total = 0.0
    for t in range(max(steps)):
        b = sum(n > t for n in steps)
        total += one_ms + (b - 1) / (B - 1) * (full_ms - one_ms) if B > 1 else one_ms
    return total


def test_the_tuners_cost_model_takes_a_batchs_emptying_out_and_prices_it_back():
    """`full_batch_step_ms` recovers a full batch's step from a decode whose requests finished unevenly, and
    `predicted_tokens_per_cpu_s` prices batches of the sample's requests; both against a step-by-step sum."""
    from types import SimpleNamespace

    from specdec.bench.tune.search import full_batch_step_ms, predicted_tokens_per_cpu_s
    one_ms, full_ms = 10.0, 26.0
    batches = [[3, 9, 4, 9], [7, 2, 2, 5]]
    cpu_ms = sum(_emptying_batch_ms(b, one_ms, full_ms, 4) for b in batches)
    steps = sum(max(b) for b in batches)
    res = dict(steps=steps, cpu=cpu_ms / 1e3, step_ms=cpu_ms / steps,
               outs=[SimpleNamespace(accept_lens=[2] * n) for b in batches for n in b])
    assert full_batch_step_ms(res, one_ms, 4) == pytest.approx(full_ms)
    assert res["step_ms"] < full_ms  # the average step, emptying included, is cheaper than a full one
    slow_one = dict(res, cpu=steps * 9.0 / 1e3, step_ms=9.0)  # one_ms measured in a slow spell: the floor holds
    assert full_batch_step_ms(slow_one, one_ms, 4) == 9.0
    sample, tokens = [3, 9, 4, 9, 7], [10, 30, 12, 31, 20]
    for B in (1, 2, 4, 16):
        virtual = (list(zip(sample, tokens)) * 16)[:len(sample) * -(-B // len(sample))]
        cut = [virtual[i:i + B] for i in range(0, len(virtual) - B + 1, B)]
        want = sum(k for b in cut for _, k in b) / (sum(
            _emptying_batch_ms([n for n, _ in b], one_ms, full_ms, B) for b in cut) / 1e3)
        assert predicted_tokens_per_cpu_s(sample, tokens, one_ms, full_ms, B) == pytest.approx(want)
    # a request that lags holds the batch: the same steps spread unevenly predict fewer tokens per second
    even = predicted_tokens_per_cpu_s([6] * 4, [20] * 4, one_ms, full_ms, 4)
    assert predicted_tokens_per_cpu_s([3, 3, 3, 15], [20] * 4, one_ms, full_ms, 4) < even


def test_the_acceptance_bench_runs_a_tuned_file_tuned_and_adaptive(pair, tmp_path):
    """`specdec bench --tuned PATH`: two more rows, their shape_policy and the bucket's shape recorded, tokens equal."""
    import pandas as pd

    from specdec.bench.suites.acceptance import run_benchmark
    from specdec.bench.cases import CASES, tuned_cases
    b, prompts = pair
    tuned = tuned_for(b.target, b.eagle, {1: ((3, 1, 4), CANDIDATES), 2: (NO_DRAFT, CANDIDATES)})
    cases = [CASES[0], *tuned_cases(tuned)]
    path = run_benchmark(b.target, {"eagle": b.eagle}, cases, prompts[:2], [1, 2], [0.0], 8, "stdlib-byte-6l",
                         out_dir=tmp_path, progress=lambda *a: None)
    df = pd.read_csv(path)
    rows = df[df["worker"] == "eagle"]
    assert sorted(rows["label"].unique()) == ["EAGLE adaptive", "EAGLE tuned"]
    assert set(rows["shape_policy"]) == {"tuned", "adaptive"}
    assert rows["same_tokens_as_target_only"].all()
    shapes = {(r.batch_size, r.num_steps, r.topk, r.num_draft_tokens) for r in rows.itertuples()}
    assert shapes == {(1, 3, 1, 4), (2, 0, 0, 1)}  # bucket 2 tuned to no draft
    assert (rows["draft_ms_per_step"] >= 0).all()  # a no-draft step's draft phase reported too (EAGLE's: none)


def test_adaptive_through_the_graph_buffers_keeps_one_entry_per_bucket_and_shape(pair):
    """The CUDA-graph path's plumbing (`DecodeGraphs`, run eagerly through its padded static buffers): each step
    shape gets its own entry, and the output is target-only's."""
    from specdec.workers.graphs import DecodeGraphs
    b, prompts = pair
    params = logprob_params(max_new=16)
    base = Engine(b.target).generate(prompts[:3], params)
    cands = [((3, 1, 4), 3.0, 1.6), ((2, 2, 4), 2.5, 1.4), (NO_DRAFT, 1.0, 0.9)]
    engine = Engine(b.target, b.eagle, tuned_for(b.target, b.eagle, {4: ((3, 1, 4), cands)}, adaptive=True),
                    max_batch=4)
    graphs = DecodeGraphs(engine.worker, capture=False)
    engine._decode = graphs.decode_step
    engine.tuned = CyclingSpec([s for s, _, _ in cands])
    assert_same_as_baseline(engine.generate(prompts[:3], params), base)
    ran = set(engine.last_stats.step_shapes)
    assert len(ran) == 3
    shapes_in_keys = {key[-3:] for key in graphs.entries}
    assert {(1, 1, 1) if s == NO_DRAFT else s for s in ran} == shapes_in_keys


def test_the_tune_command_refuses_a_kind_that_keeps_one_shape(capsys):
    from specdec.cli.tune import main
    assert main(["--model", "stdlib-byte-6l", "--kind", "mtp"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdec tune: error: draft kind 'mtp' runs on MultiLayerEagleWorkerV2") and "\n" not in err
    with pytest.raises(SystemExit) as exit_:  # --kind lists its choices: argparse refuses an unknown one
        main(["--model", "stdlib-byte-6l", "--kind", "medusa"])
    assert exit_.value.code == 2 and "invalid choice: 'medusa'" in capsys.readouterr().err


def test_the_check_grid_measures_every_shape_in_turn_with_the_outputs_of_target_only(pair):
    """`check_grid` (the goal's comparison, its batches taken in turn by every shape): a row per shape, the tuned
    shape and adaptive at each bucket, each pass's figures summed from its batches as one decode of them all gives,
    and every output target-only's."""
    from specdec.bench.common import Run
    from specdec.bench.tune.check import check_grid
    from specdec.bench.tune.search import CHECK_GRID, FIXED_TREE, Measurer
    from specdec.models.ngram import NgramDraft
    b, prompts = pair
    draft = NgramDraft()
    tuned = tuned_for(b.target, draft, {1: ((3, 1, 4), CANDIDATES[1:3]), 2: ((2, 2, 4), CANDIDATES[1:3])}, kind="ngram")
    m = Measurer(b.target, draft, max_seq_len=64, max_new_tokens=6)
    rows = []
    out = check_grid(m, tuned, {"code": prompts}, [1, 2], 2, rows, Run("tune", "cpu"), "stdlib-byte-6l",
                     progress=lambda *a: None)
    assert set(out) == {("code", 1), ("code", 2)} and all(r["same_tokens"] for r in out.values())
    for B in (1, 2):
        labels = [r.label for r in rows if r.batch_size == B]
        assert len(labels) == len(CHECK_GRID) + 3 and "target-only" in labels and "adaptive" in labels
        assert all(r.same_tokens_as_target_only for r in rows if r.batch_size == B)
        assert out["code", B]["best_grid"] in CHECK_GRID
        tree = next(r for r in rows if r.batch_size == B and (r.num_steps, r.topk, r.num_draft_tokens) == FIXED_TREE)
        whole = m.decode(FIXED_TREE, [prompts[i:i + B] for i in range(0, len(prompts), B)])
        assert tree.mean_accept_len == round(whole["accept"], 4) and tree.num_prompts == len(prompts)
        for r in rows:  # the check's rows keep every pass: the median pass is one of the two
            passes = [float(x) for x in r.tokens_per_cpu_s_by_pass.split(";")]
            assert len(passes) == 2 and r.tokens_per_cpu_s in passes
        assert all(out["code", B][k] > 0 for k in ("tuned_over_best_grid_held_out", "adaptive_over_best_grid_held_out"))


def test_the_grids_best_is_chosen_on_other_passes_than_the_one_compared():
    """`held_out_ratio` against a hand computation: in each pass the grid's best is the shape with the highest median
    over the other passes. Here the two shapes' medians tie at 100 and the candidate's median pass is 98 (0.98x the
    naive best), while pass by pass it beats whichever shape the other passes pick."""
    from specdec.bench.tune.search import held_out_ratio
    grid = {"A": [100.0, 90.0, 110.0], "B": [95.0, 105.0, 100.0]}
    # pass 0: A 100 vs B 102.5 on passes 1, 2 -> B, 98 / 95; pass 1: A 105 vs B 97.5 -> A, 97 / 90; pass 2: A 95 vs
    # B 100 -> B, 104 / 100
    assert held_out_ratio([98.0, 97.0, 104.0], grid) == pytest.approx(1.04)
    assert held_out_ratio([98.0], {"A": [100.0]}) is None  # one pass: nothing to choose on
    assert held_out_ratio([98.0, 97.0], grid) is None  # the passes do not line up


def test_a_sampled_check_set_decodes_every_other_request_with_its_own_params(pair):
    """`sampled_prompts` pairs every other prompt with temperature-1 params: the measurer decodes each request with its
    own params (what a plain engine gives for them, request by request), and the grid check judges token identity on
    the greedy requests only."""
    from specdec.bench.common import Run
    from specdec.bench.tune.check import check_grid, sampled_prompts
    from specdec.bench.tune.search import Measurer
    b, prompts = pair
    m = Measurer(b.target, b.eagle, max_seq_len=64, max_new_tokens=8)
    sampled = sampled_prompts(prompts, m.params)
    params = [m.params, SamplingParams(max_new_tokens=8, temperature=1.0)] * 2
    assert [x[1] if isinstance(x, tuple) else m.params for x in sampled] == params
    got = m.decode(None, [sampled])["outs"]
    want = Engine(b.target).generate(prompts, params, seed=0)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    greedy = Engine(b.target).generate(prompts, m.params, seed=0)
    assert any(got[i].token_ids != greedy[i].token_ids for i in (1, 3))  # the odd ones did sample
    tuned = tuned_for(b.target, b.eagle, {2: ((3, 1, 4), CANDIDATES)})
    rows = []
    out = check_grid(m, tuned, {"sampled": sampled}, [2], [2], rows, Run("tune", "cpu"), "stdlib-byte-6l",
                     progress=lambda *a: None)
    assert out["sampled", 2]["same_tokens"] and all(r.same_tokens_as_target_only for r in rows)
    assert {r.prompt_set for r in rows} == {"sampled"}
    assert all(len(r.tokens_per_cpu_s_by_pass.split(";")) == 2 for r in rows)  # the bucket's own count of passes


def test_the_tune_command_checks_a_tuned_file_and_refuses_an_unknown_check_set(capsys, tmp_path):
    from specdec.cli.tune import main
    with pytest.raises(SystemExit):
        main(["--model", "stdlib-byte-6l", "--check-sets", "code,poetry"])
    assert "unknown prompt set(s) ['poetry']" in capsys.readouterr().err
    assert main(["--model", "stdlib-byte-6l", "--check-tuned", str(tmp_path / "missing.json")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdec tune: error: tuned file") and "cannot be read" in err and "\n" not in err


def test_the_tune_command_refuses_check_repeats_that_do_not_fit_the_buckets(capsys):
    from specdec.cli.tune import main
    for bad in ("3,9,9", "0", "three"):
        with pytest.raises(SystemExit):
            main(["--model", "stdlib-byte-6l", "--batch-sizes", "1,16", "--check-repeats", bad])
        assert "--check-repeats must be one count >= 1 or one per bucket" in capsys.readouterr().err
