"""EagleWorkerV2 and MultiLayerEagleWorkerV2 against plain target-only decoding."""
import importlib
import random

import pytest
import torch

import reference
from specdec import Engine, SamplingParams, SpecConfig
from specdec.models import random_eagle_head, random_llama, random_mtp
from specdec.contract import TreeAttentionPlan
from specdec.workers import EagleWorkerV2, MultiLayerEagleWorkerV2
from tests.equivalence import no_host_sync
from tests.helpers import (LOGPROB_ATOL, always_wrong_eagle, always_wrong_mtp, assert_same_as_baseline, bigram_target,
                           check_sampling_is_lossless, logprob_params, near_bigram_target, perfect_drafts_by_kind,
                           perfect_eagle, perfect_mtp)


def _random_eagle_configs(n, seed=0):
    rng = random.Random(seed)
    configs = []
    for i in range(n):
        S, K = rng.randint(1, 5), rng.choice([1, 2, 4])
        w_max = 1 + K + (S - 1) * K * K
        W = S + 1 if K == 1 else rng.randint(2, w_max)
        B = rng.randint(1, 4)
        prompts = [[rng.randrange(64) for _ in range(rng.randint(1, 9))] for _ in range(B)]
        configs.append((i, SpecConfig(S, K, W), prompts, rng.choice([0.15, 0.3, 0.6])))
    return configs


@pytest.mark.parametrize("seed, spec, prompts, mix", _random_eagle_configs(24))
def test_eagle_greedy_is_lossless(seed, spec, prompts, mix):
    target = near_bigram_target(seed=seed, mix=mix, num_key_value_heads=2)
    base = Engine(target, max_seq_len=96).generate(prompts, logprob_params())
    draft = perfect_eagle(target, seed=seed)
    engine = Engine(target, draft=draft, spec=spec, impl="reference", max_seq_len=96)
    outs = engine.generate(prompts, [logprob_params() if i % 2 == 0 else SamplingParams(max_new_tokens=14)
                                     for i in range(len(prompts))])
    for i, (o, b) in enumerate(zip(outs, base)):
        if i % 2:
            b = type(b)(b.token_ids, b.finish_reason)  # this request did not ask for logprobs
        assert_same_as_baseline([o], [b])


@pytest.mark.parametrize("S", [1, 2, 3, 4])
@pytest.mark.parametrize("chain", [False, True])
def test_mtp_greedy_is_lossless(S, chain):
    target = near_bigram_target(seed=S, mix=0.3)
    prompts = [[1, 2, 3, 4, 5, 6], [7], [9, 10, 11], [3, 3]]
    base = Engine(target, max_seq_len=96).generate(prompts, logprob_params(max_new=17))
    engine = Engine(target, draft=perfect_mtp(target, S, chain, seed=S), spec=SpecConfig(S), impl="reference",
                    max_seq_len=96)
    assert_same_as_baseline(engine.generate(prompts, logprob_params(max_new=17)), base)
    assert 1.0 < engine.last_stats.mean_accept_len  # the plumbing accepts something


@pytest.mark.parametrize("chain", [False, True])
def test_mtp_logprobs_in_a_mixed_batch(chain):
    """The crash SGLang had: return_logprob with a multi-layer draft, requests that ask mixed with
    requests that do not, greedy with sampled."""
    target = near_bigram_target(seed=7, mix=0.3)
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
    params = [logprob_params(), SamplingParams(max_new_tokens=14, temperature=0.8),
              logprob_params(temperature=0.7, top_k=8), SamplingParams(max_new_tokens=14, return_logprob=True)]
    base = Engine(target, max_seq_len=96).generate(prompts, params, seed=4)
    engine = Engine(target, draft=perfect_mtp(target, 3, chain), spec=SpecConfig(3), impl="reference", max_seq_len=96)
    outs = engine.generate(prompts, params, seed=4)
    greedy = [0, 3]
    assert_same_as_baseline([outs[i] for i in greedy], [base[i] for i in greedy])
    # Sampled requests draw from the target through a different procedure: same support, and the
    # logprob of every emitted token equals the target's on that very sequence.
    for i in (1, 2):
        o = outs[i]
        assert (o.logprobs is None) == (not params[i].return_logprob)
        if o.logprobs is not None:
            check_logprobs_against_target(target, prompts[i], o, params[i])


def check_logprobs_against_target(target, prompt, out, sp):
    seq = prompt + out.token_ids
    with torch.no_grad():
        logits = target(torch.tensor([seq]), torch.arange(len(seq))[None]).logits
    rows = torch.log_softmax(logits[0, len(prompt) - 1:-1] / sp.temperature, dim=-1)
    for j, tok in enumerate(out.token_ids):
        assert abs(out.logprobs[j] - rows[j, tok].item()) <= LOGPROB_ATOL
        top = rows[j].topk(sp.top_logprobs_num).indices.tolist()
        assert [t for _, t in out.top_logprobs[j]] == top


def test_eagle_sampled_logprobs_are_the_targets():
    target = near_bigram_target(seed=2, mix=0.3)
    sp = logprob_params(max_new=20, temperature=0.9, top_p=0.9)
    engine = Engine(target, draft=perfect_eagle(target), spec=SpecConfig(3, 2, 6), impl="reference", max_seq_len=96)
    prompts = [[1, 2], [3, 4, 5]]
    for p, o in zip(prompts, engine.generate(prompts, sp, seed=9)):
        check_logprobs_against_target(target, p, o, sp)


# ---- a perfect draft accepts what the tree holds; an always-wrong one accepts nothing ----------

def _record_trees(engine):
    """Wrap the worker's ops so each step's built tree is recorded."""
    trees = []
    ops = engine.worker.ops

    class Recording:
        def __getattr__(self, name):
            return getattr(ops, name)

        def build_tree_kernel_efficient(self, *args):
            out = ops.build_tree_kernel_efficient(*args)
            trees.append(out)
            return out

    engine.worker.ops = Recording()
    return trees


def _depth_in_tree(tree, b, W, continuation):
    """How many tokens of `continuation` (the target's greedy tokens after the root) form a
    root-to-node path of request b's tree; an independent walk over first-child / next-sibling."""
    _, _, _, nxt, sib, tokens = tree
    tokens = tokens.view(-1, W)[b].tolist()
    nxt, sib = nxt[b].tolist(), sib[b].tolist()
    node, depth = 0, 0
    for want in continuation:
        child = nxt[node]
        while child != -1 and tokens[child] != want:
            child = sib[child]
        if child == -1:
            break
        node, depth = child, depth + 1
    return depth


@pytest.mark.parametrize("spec", [SpecConfig(1, 1), SpecConfig(4, 1), SpecConfig(3, 2, 6), SpecConfig(4, 4, 16),
                                  SpecConfig(5, 4, 21), SpecConfig(2, 3, 12)])
def test_perfect_eagle_accepts_the_greedy_path_present_in_the_tree(spec):
    target = bigram_target(seed=3)
    prompts = [[1, 2, 3], [9], [4, 4, 4, 4, 4]]
    base = Engine(target, max_seq_len=96).generate(prompts, SamplingParams(max_new_tokens=24))
    engine = Engine(target, draft=perfect_eagle(target), spec=spec, impl="reference", max_seq_len=96)
    trees = _record_trees(engine)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=24))
    assert [o.token_ids for o in outs] == [b.token_ids for b in base]
    checked = 0
    for b, (o, ref) in enumerate(zip(outs, base)):
        emitted = 1  # the prefill's token is the first root
        for step, acc in enumerate(o.accept_lens):
            rest = ref.token_ids[emitted:]
            # skip steps after a request left the batch (batch rows shift) or near max_new_tokens
            if trees[step][5].numel() == len(prompts) * spec.num_draft_tokens and len(rest) > spec.num_steps:
                expect = 1 + _depth_in_tree(trees[step], b, spec.num_draft_tokens, rest)
                assert acc == expect
                if spec.topk == 1:
                    assert acc == spec.num_steps + 1
                checked += 1
            emitted += acc
    assert checked >= 6


@pytest.mark.parametrize("spec", [SpecConfig(3, 1), SpecConfig(3, 4, 10)])
def test_always_wrong_eagle_accepts_one_and_stays_lossless(spec):
    target = bigram_target(seed=4)
    prompts = [[1, 2, 3], [9, 8]]
    base = Engine(target, max_seq_len=96).generate(prompts, logprob_params())
    engine = Engine(target, draft=always_wrong_eagle(target), spec=spec, impl="reference", max_seq_len=96)
    outs = engine.generate(prompts, logprob_params())
    assert_same_as_baseline(outs, base)
    assert all(a == 1 for o in outs for a in o.accept_lens)


@pytest.mark.parametrize("S, chain", [(1, False), (3, False), (2, True), (4, True)])
def test_perfect_and_always_wrong_mtp(S, chain):
    target = bigram_target(seed=5)
    prompts = [[1, 2, 3], [9], [6, 6, 6, 6]]
    base = Engine(target, max_seq_len=96).generate(prompts, logprob_params(max_new=21))
    perfect = Engine(target, draft=perfect_mtp(target, S, chain), spec=SpecConfig(S), impl="reference", max_seq_len=96)
    outs = perfect.generate(prompts, logprob_params(max_new=21))
    assert_same_as_baseline(outs, base)
    for o in outs:
        assert all(a == S + 1 for a in o.accept_lens)
    wrong = Engine(target, draft=always_wrong_mtp(target, S, chain), spec=SpecConfig(S), impl="reference",
                   max_seq_len=96)
    outs = wrong.generate(prompts, logprob_params(max_new=21))
    assert_same_as_baseline(outs, base)
    assert all(a == 1 for o in outs for a in o.accept_lens)


def test_both_workers_share_one_logprob_path():
    """For identical verify results (perfect chain drafts, S = 3), EAGLE and MTP emit bit-identical
    logprob outputs."""
    target = bigram_target(seed=6)
    prompts = [[1, 2, 3], [4]]
    sp = logprob_params(max_new=16, temperature=0.6)
    a = Engine(target, draft=perfect_eagle(target), spec=SpecConfig(3), impl="reference", max_seq_len=96)
    b = Engine(target, draft=perfect_mtp(target, 3, False), spec=SpecConfig(3), impl="reference", max_seq_len=96)
    oa, ob = a.generate(prompts, sp, seed=1), b.generate(prompts, sp, seed=1)
    for x, y in zip(oa, ob):
        assert x.accept_lens == y.accept_lens
        assert (x.token_ids, x.logprobs, x.top_logprobs, x.token_ids_logprobs) == \
            (y.token_ids, y.logprobs, y.top_logprobs, y.token_ids_logprobs)


# ---- after every step, draft KV over committed tokens equals a fresh prefill --------------------

def _step_through(worker, prompts, params, steps):
    worker.prefill(prompts, params, seed=0)
    for _ in range(steps):
        out = worker.decode_step()
        lens = out.accept_lens.tolist()
        worker.sync_lengths(lens)
        yield lens


@pytest.mark.parametrize("head", ["eagle", "eagle3"])
def test_eagle_draft_and_target_kv_equal_a_fresh_prefill(head):
    """After every step, the draft's and the target's caches over the committed tokens equal a fresh prefill
    of them: for an EAGLE head (reading the target's final hidden states) and an EAGLE-3 head (reading the
    features of several layers, through its fc)."""
    target = near_bigram_target(seed=8, mix=0.4, num_key_value_heads=2,
                                num_hidden_layers=2 if head == "eagle" else 4)
    if head == "eagle":
        draft = perfect_eagle(target)
    else:
        from specdec.models import random_eagle3_head
        draft = random_eagle3_head(target, draft_vocab_size=40, seed=3)
    features = getattr(draft, "feature_layers", None)
    engine = Engine(target, draft=draft, spec=SpecConfig(3, 2, 6), impl="reference", max_seq_len=96)
    w = engine.worker
    prompts = [[1, 2, 3, 4], [9, 9]]
    sp = [SamplingParams(max_new_tokens=40)] * 2
    for _ in _step_through(w, prompts, sp, 6):
        n = w.state.seq_lens.tolist()
        committed = [_committed_tokens(w, b, prompts[b], n[b]) for b in range(2)]
        for b in range(2):
            seq = torch.tensor([committed[b] + [w.state.last_tokens[b].item()]])
            nb = n[b]
            with torch.no_grad():
                out = target(seq[:, :nb], torch.arange(nb)[None], features=features)
                h = out.hidden if features is None else out.features
                fresh_cache = _fresh_draft_kv(draft, seq[:, 1:nb + 1], h, nb)
                fresh_target = _fresh_target_kv(target, seq[:, :nb], nb)
            slot = w.slot_list[b]
            for (k_ref, v_ref), k, v in zip(fresh_cache, w.draft_cache.k, w.draft_cache.v):
                assert (k[slot, :nb] - k_ref).abs().max() <= 1e-4
                assert (v[slot, :nb] - v_ref).abs().max() <= 1e-4
            # the target's cache too: verify wrote the tree, commit moved the accepted path into place
            for (k_ref, v_ref), k, v in zip(fresh_target, w.cache.k, w.cache.v):
                assert (k[slot, :nb] - k_ref).abs().max() <= 1e-4
                assert (v[slot, :nb] - v_ref).abs().max() <= 1e-4


def _committed_tokens(worker, b, prompt, n):
    """Recover the committed tokens from a fresh greedy run (the worker is greedy here)."""
    engine = Engine(worker.target, max_seq_len=96)
    out = engine.generate([prompt], SamplingParams(max_new_tokens=n - len(prompt) + 1))[0]
    return (prompt + out.token_ids)[:n]


def _fresh_target_kv(target, ids, n):
    """KV that each target layer computes over positions 0..n-1 from scratch."""
    from specdec.kv_cache import KVCache
    from specdec.models import AttentionMetadata
    cache = KVCache.for_model(target.config, target.config.num_hidden_layers, 1, n + 1, torch.float32, "cpu")
    meta = AttentionMetadata(torch.tensor([0]), torch.tensor([0]), attn_len=n, ops=reference)
    target(ids, torch.arange(n)[None], cache, meta)
    return [(cache.k[i][0, :n], cache.v[i][0, :n]) for i in range(len(cache.k))]


def _fresh_draft_kv(draft, ids, hidden, n):
    """KV that each draft layer computes over positions 0..n-1 from scratch."""
    from specdec.kv_cache import KVCache
    from specdec.models import AttentionMetadata
    cache = KVCache.for_model(draft.config, draft.config.num_hidden_layers, 1, n + 1, torch.float32, "cpu")
    meta = AttentionMetadata(torch.tensor([0]), torch.tensor([0]), attn_len=n, ops=reference)
    draft(ids, hidden, torch.arange(n)[None], cache, meta)  # an EAGLE-3 head's fc maps the target features
    return [(cache.k[i][0, :n], cache.v[i][0, :n]) for i in range(len(cache.k))]


@pytest.mark.parametrize("chain", [False, True])
def test_mtp_draft_kv_equals_a_fresh_prefill(chain):
    """Layer k's KV at positions whose input token is known (t + k + 1 <= n) equals a fresh run of
    the layers over the committed stream: rejected guesses leave nothing stale behind."""
    from specdec.kv_cache import KVCache
    from specdec.models import AttentionMetadata
    S = 3
    target = near_bigram_target(seed=9, mix=0.4)
    draft = perfect_mtp(target, S, chain)
    engine = Engine(target, draft=draft, spec=SpecConfig(S), impl="reference", max_seq_len=128)
    w = engine.worker
    prompts = [[1, 2, 3, 4, 5], [9]]
    accepted = []
    for lens in _step_through(w, prompts, [SamplingParams(max_new_tokens=60)] * 2, 8):
        accepted.extend(lens)
        for b in range(2):
            n = int(w.state.seq_lens[b])
            stream = _committed_tokens(w, b, prompts[b], n) + [int(w.state.last_tokens[b])]
            ids = torch.tensor([stream])
            with torch.no_grad():
                h = target(ids[:, :n], torch.arange(n)[None]).hidden
                cache = KVCache.for_model(draft.config, S, 1, n + S + 2, torch.float32, "cpu")
                meta = AttentionMetadata(torch.tensor([0]), torch.tensor([0]), attn_len=n, ops=reference)
                hidden = h
                for k in range(S):
                    valid = n - k - 1 + 1  # positions 0 .. n-k-1
                    if valid <= 0:
                        break
                    toks = ids[:, k + 1:k + 1 + valid]
                    toks = torch.cat([toks, torch.zeros(1, n - valid, dtype=torch.long)], dim=1)
                    out = draft.forward_layer(k, toks, hidden, torch.arange(n)[None], cache, meta).hidden
                    slot = w.slot_list[b]
                    assert (w.draft_cache.k[k][slot, :valid] - cache.k[k][0, :valid]).abs().max() <= 1e-4
                    assert (w.draft_cache.v[k][slot, :valid] - cache.v[k][0, :valid]).abs().max() <= 1e-4
                    if chain:
                        hidden = out
    assert any(a < S + 1 for a in accepted) and any(a > 1 for a in accepted)  # rejections happened


# ---- sampling losslessness ----------------------------------------------------------------------

SAMPLING_CASES = [
    ("eagle", SpecConfig(2, 2, 4), 1.0, -1, 1.0),
    ("eagle", SpecConfig(2, 1), 0.5, -1, 1.0),
    ("eagle", SpecConfig(2, 2, 5), 1.0, 3, 1.0),
    ("eagle", SpecConfig(2, 2, 4), 1.0, -1, 0.8),
    ("eagle", SpecConfig(2, 3, 7), 0.8, -1, 1.0),  # K=3: three siblings, the full tree
    ("mtp", SpecConfig(2), 0.5, 3, 1.0),
    ("mtp_chain", SpecConfig(2), 1.0, -1, 0.8),
    # top-p over the renormalised top-3: the other order moves a total variation of 0.28 here
    ("eagle", SpecConfig(2, 2, 4), 1.0, 3, 0.7),
]
SLOW_SAMPLING_CASES = [(d, s, t, k, p) for d in ("eagle", "mtp", "mtp_chain")
                       for s in ([SpecConfig(2, 1), SpecConfig(2, 3, 7)] if d == "eagle" else [SpecConfig(2)])
                       for t, k, p in [(1.0, -1, 1.0), (0.5, -1, 1.0), (1.0, 3, 1.0), (1.0, -1, 0.8)]]


@pytest.mark.parametrize("kind, spec, temperature, top_k, top_p", SAMPLING_CASES)
def test_sampling_is_lossless(kind, spec, temperature, top_k, top_p):
    """Joint distribution of the first three tokens (the 2nd and 3rd come from speculative steps)
    against the exact one by enumeration; chi-square test, false-failure rate 1e-6 per case."""
    check_sampling_is_lossless(kind, spec, temperature, top_k, top_p, N=5000)


@pytest.mark.slow
@pytest.mark.parametrize("kind, spec, temperature, top_k, top_p", SLOW_SAMPLING_CASES)
def test_sampling_is_lossless_full_grid(kind, spec, temperature, top_k, top_p):
    check_sampling_is_lossless(kind, spec, temperature, top_k, top_p, N=20000)


# ---- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    (dict(num_steps=0), "num_steps must be an int >= 1, got 0"),
    (dict(num_steps=2, topk=0), "topk must be an int >= 1, got 0"),
    (dict(num_steps=2, topk=2, num_draft_tokens=8), r"num_draft_tokens=8 must be in \[2, 1 \+ topk .*\] = \[2, 7\]"),
    (dict(num_steps=2, topk=2, num_draft_tokens=1), "num_draft_tokens=1"),
    (dict(num_steps=3, topk=1, num_draft_tokens=3), "must equal num_steps \\+ 1 = 4, got 3"),
    (dict(num_steps=True), "num_steps must be an int >= 1, got bool True"),
    (dict(num_steps=2, topk=True), "topk must be an int >= 1, got bool True"),
    (dict(num_steps=2, topk=2, num_draft_tokens=4.0), "num_draft_tokens must be an int, got float 4.0"),
])
def test_spec_config_violations(kw, match):
    with pytest.raises(ValueError, match=match):
        SpecConfig(**kw)


def test_mismatched_or_misshapen_drafts_are_rejected_at_construction():
    target = random_llama(vocab_size=64, hidden_size=32)
    other = random_llama(vocab_size=80, hidden_size=32, seed=1)
    with pytest.raises(ValueError, match="draft vocab_size=80 does not match the target's vocab_size=64"):
        Engine(target, draft=random_eagle_head(other), spec=SpecConfig(2))
    with pytest.raises(ValueError, match="topk=1 and num_draft_tokens=num_steps\\+1"):
        Engine(target, draft=random_mtp(target, 3), spec=SpecConfig(3, 2, 5))
    with pytest.raises(ValueError, match="needs num_steps=2 layers, got 3"):
        Engine(target, draft=random_mtp(target, 3), spec=SpecConfig(2))
    with pytest.raises(ValueError, match=r"LlamaForCausalLM: draft_lm; DFlashDraftModel: dflash\), got Linear"):
        Engine(target, draft=torch.nn.Linear(2, 2), spec=SpecConfig(2))


def test_a_worker_constructed_with_the_reference_ops_calls_them():
    target = random_llama()
    w = EagleWorkerV2(target, random_eagle_head(target), SpecConfig(2, 2, 4), reference, max_batch=2, max_seq_len=32)
    assert w.ops is reference
    w = MultiLayerEagleWorkerV2(target, random_mtp(target, 2), SpecConfig(2), reference, max_batch=2, max_seq_len=32)
    assert w.ops is reference
    assert Engine(target, impl="reference").worker.ops is reference


@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_decode_step_makes_no_host_sync(kind):
    """No value read on the host inside a decode step: not .item() / .tolist() / a tensor-valued `if`,
    nor the syncs hidden in C++ ops (nonzero, boolean-mask indexing, tensor-valued repeat_interleave);
    with greedy and sampled requests, logprobs, top-k and token-id logprobs in the batch."""
    target = near_bigram_target(seed=3, mix=0.3)
    draft, spec = perfect_drafts_by_kind(target)[kind]
    engine = Engine(target, draft=draft, spec=spec, impl="reference", max_seq_len=96)
    w = engine.worker
    params = [logprob_params(temperature=0.7, top_k=5, top_p=0.9),
              SamplingParams(max_new_tokens=14)]
    w.prefill([[1, 2, 3], [4, 5]], params, seed=0)
    for _ in range(2):
        with no_host_sync():
            step = w.decode_step()
    assert step.accept_lens.shape == (2,)


def _run_on_meta(kind):
    w = _unbound_worker(kind, near_bigram_target(seed=3, mix=0.3).to("meta"), reference, max_batch=2, max_seq_len=96)
    params = [logprob_params(temperature=0.7, top_k=5, top_p=0.9), SamplingParams(max_new_tokens=14)]
    with torch.inference_mode():
        w.prefill([[1, 2, 3], [4, 5]], params, seed=0)
        for _ in range(2):
            step = w.decode_step()
    return step


@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_whole_steps_run_on_the_meta_device(kind):
    """A tensor on `meta` has a shape and no value, so every read of a value, in Python or inside a C++ op
    (.item(), nonzero, boolean-mask indexing, tensor-valued repeat_interleave, a data-dependent shape),
    fails there: a prefill and decode steps that run on `meta`, logprobs included, make no host sync."""
    step = _run_on_meta(kind)
    assert step.predict.device.type == "meta" and step.accept_lens.shape == (2,)


@pytest.mark.parametrize("sync", ["nonzero", "bool_mask", "repeat_interleave", "item"])
def test_the_meta_device_catches_a_host_sync_in_a_step(monkeypatch, sync):
    """The check above can fail: a sync slipped into verify (one that a Python-level guard may miss when it
    happens inside C++) makes the step fail on `meta`."""
    real = reference.verify_tree_greedy

    def leaky(candidates, *args):
        x = candidates.flatten()
        if sync == "nonzero":
            x.nonzero()
        elif sync == "bool_mask":
            _ = x[x > 0]
        elif sync == "repeat_interleave":
            x.repeat_interleave(x.clamp(0, 2))
        else:
            x[0].item()
        return real(candidates, *args)

    monkeypatch.setattr(reference, "verify_tree_greedy", leaky)
    with pytest.raises((RuntimeError, NotImplementedError)):
        _run_on_meta("eagle")


@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_a_worker_driven_without_length_syncs_is_still_lossless(kind):
    """The host's length bound only grows when nobody syncs it: attention spans get longer, the tokens
    stay target-only's (a stale host length once changed the ninth token)."""
    target = near_bigram_target(seed=4, mix=0.4)
    draft, spec = perfect_drafts_by_kind(target)[kind]
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10]]
    base = Engine(target, max_seq_len=160).generate(prompts, SamplingParams(max_new_tokens=24))
    w = Engine(target, draft=draft, spec=spec, impl="reference", max_seq_len=160).worker
    step = w.prefill(prompts, [SamplingParams(max_new_tokens=24)] * 2, seed=0)
    tokens = [[t] for t in step.emitted_tokens()[:, 0].tolist()]
    while min(len(t) for t in tokens) < 24:
        step = w.decode_step()
        lens, emitted = step.accept_lens.tolist(), step.emitted_tokens().tolist()
        for b in range(2):
            tokens[b] += emitted[b][:lens[b]]
    true_max = max(int(n) for n in w.state.seq_lens)
    assert w._unsynced_steps > 1 and w.len_bound >= true_max
    if kind != "target-only":
        assert w.len_bound > true_max  # the bound went stale, as intended
    for b in range(2):
        assert tokens[b][:24] == base[b].token_ids
    with pytest.raises(ValueError, match="lengths for 2 requests"):
        w.sync_lengths([1])


@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_stop_token_inside_an_accepted_window(kind):
    """A stop token (or max_new_tokens) in the middle of a multi-token step cuts tokens and
    logprobs at the same place as target-only decoding does."""
    target = bigram_target(seed=12)
    prompts = [[1, 2, 3], [7, 7]]
    free = Engine(target, max_seq_len=96).generate(prompts, SamplingParams(max_new_tokens=30))
    stops = [free[0].token_ids[6], free[1].token_ids[4]]
    params = [logprob_params(max_new=30), logprob_params(max_new=30)]
    for p, s in zip(params, stops):
        p.stop_token_ids = [s]
    base = Engine(target, max_seq_len=96).generate(prompts, params)
    draft, spec = ((perfect_eagle(target), SpecConfig(4, 2, 8)) if kind == "eagle"
                   else (perfect_mtp(target, 4, True), SpecConfig(4)))
    outs = Engine(target, draft=draft, spec=spec, impl="reference", max_seq_len=96).generate(prompts, params)
    assert_same_as_baseline(outs, base)
    assert all(o.finish_reason == "stop" for o in outs)
    # every request's stop fell inside a window: its last step produced tokens past the stop, dropped
    assert all(1 + sum(o.accept_lens) > len(o.token_ids) for o in outs)
    n = 6 if kind == "eagle" else 7  # a length that falls inside a step of both requests (checked below)
    odd = logprob_params(max_new=n)
    cut = Engine(target, draft=draft, spec=spec, impl="reference", max_seq_len=96).generate(prompts, odd)
    assert_same_as_baseline(cut, Engine(target, max_seq_len=96).generate(prompts, odd))
    assert all(1 + sum(o.accept_lens) > len(o.token_ids) == n for o in cut)


@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_padded_static_buffer_steps_equal_eager_steps(kind):
    """The CUDA-graph plumbing without a GPU: every step runs through a bucket's static buffers (batch
    padded with copies of request 0 on the scratch cache row, state copied in and out), as a replay
    would; requests leave mid-way so buckets change; tokens and logprobs equal plain eager steps."""
    from specdec.workers.graphs import DecodeGraphs, batch_buckets

    assert batch_buckets(6) == [1, 2, 4, 6] and batch_buckets(1) == [1] and batch_buckets(8) == [1, 2, 4, 8]
    target = near_bigram_target(seed=6, mix=0.4)
    draft, spec = perfect_drafts_by_kind(target)[kind]
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [3, 3, 3, 3], [2, 7]]
    params = [logprob_params(max_new=6 + 5 * i, temperature=0.9 * (i % 2), top_k=-1 if i < 3 else 4) for i in range(5)]
    eager = Engine(target, draft, spec, impl="reference", max_batch=6, max_seq_len=96)
    base = eager.generate(prompts, params, seed=3)
    padded = Engine(target, draft, spec, impl="reference", max_batch=6, max_seq_len=96)
    graphs = DecodeGraphs(padded.worker, capture=False)
    padded._decode = graphs.decode_step
    outs = padded.generate(prompts, params, seed=3)
    assert_same_as_baseline(outs, base)  # padding changes matmul blocking: logprobs within the table
    assert {key[0] for key in graphs.entries} >= {4, 6}  # 5 requests padded to 6, then fewer to 4 ...
    # padded rows duplicate request 0 on the scratch row: on a GPU two programs moving the same row's KV
    # in a commit would race, so they must never share a real request's row
    scratch = padded.worker.cache.scratch_slot
    assert all(int(e.inputs["state.slots"][-1]) == scratch for k, e in graphs.entries.items() if k[0] == 6)
    assert padded.worker.cache.num_free == 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_cuda_graph_replay_equals_eager(kind):
    """On a GPU: every bucket captured and replayed gives the tokens of eager fast decoding."""
    target = near_bigram_target(seed=6, mix=0.4).cuda()
    draft, spec = perfect_drafts_by_kind(target)[kind]
    draft = draft.cuda() if draft is not None else None
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [3, 3, 3, 3], [2, 7]]
    params = [logprob_params(max_new=6 + 5 * i) for i in range(5)]
    eager = Engine(target, draft, spec, impl="fast", max_batch=6, max_seq_len=96, cuda_graphs=False)
    graphed = Engine(target, draft, spec, impl="fast", max_batch=6, max_seq_len=96, cuda_graphs=True)
    for a, b in zip(graphed.generate(prompts, params), eager.generate(prompts, params)):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= 1e-4


class _RecordingOps:
    """An ops module that records, per call, the op's name and the shapes / dtypes of its tensor
    arguments, and its Python arguments (the host bound attn_len excepted: the fast kernels do not read
    it; so is everything of an attention plan that is sized by it, which only the reference's has)."""

    def __init__(self, ops):
        self._ops = ops
        self.calls = []

    def __getattr__(self, name):
        fn = getattr(self._ops, name)

        def recorded(*args, **kwargs):
            shown = list(args)
            if name == "tree_attention":
                shown[7] = "attn_len"
            if name == "plan_tree_attention":
                shown[4] = "attn_len"
            self.calls.append((name, _describe(shown), _describe(kwargs)))
            return fn(*args, **kwargs)

        return recorded


def _describe(x):
    if isinstance(x, TreeAttentionPlan):
        return ("plan", x.impl, x.batch, x.num_new, x.write_offset, x.max_seq_len,
                _describe(x.tensors) if x.impl == "fast" else "attn_len-sized")
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_describe(v) for v in x)
    if isinstance(x, dict):
        return tuple((k, _describe(v)) for k, v in sorted(x.items()))
    if hasattr(x, "__dict__") and not callable(x):
        return (type(x).__name__, _describe(vars(x)))
    return x


def _unbound_worker(kind, target, ops, **kw):
    from specdec.workers.base import TargetOnlyWorker
    from specdec.workers.eagle import EagleWorkerV2
    from specdec.workers.multi_layer_eagle import MultiLayerEagleWorkerV2
    draft, spec = perfect_drafts_by_kind(target)[kind]
    if kind == "target-only":
        return TargetOnlyWorker(target, ops, **kw)
    cls = EagleWorkerV2 if kind == "eagle" else MultiLayerEagleWorkerV2
    return cls(target, draft, spec, ops, **kw)


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_decode_steps_have_identical_op_shapes(kind, impl):
    """Consecutive decode steps call the same ops with the same tensor shapes and Python values (what a
    CUDA graph needs), whatever was accepted, with greedy and sampled requests and logprobs."""
    ops = _RecordingOps(importlib.import_module(impl))
    w = _unbound_worker(kind, near_bigram_target(seed=3, mix=0.5), ops, max_batch=2, max_seq_len=96)
    w.prefill([[1, 2, 3], [4, 5]], [logprob_params(temperature=0.7, top_k=5, top_p=0.9), logprob_params(max_new=30)],
              seed=0)
    per_step = []
    accepted = set()
    for _ in range(4):
        ops.calls = []
        step = w.decode_step()
        accepted.update(step.accept_lens.tolist())
        per_step.append(ops.calls)
    assert len(per_step[0]) > 3
    assert all(calls == per_step[0] for calls in per_step[1:])
    if kind != "target-only":
        assert len(accepted) > 1  # the steps accepted different lengths


@pytest.mark.parametrize("rope", [{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
                                  {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16}])
def test_scaled_ropes_stay_lossless(rope):
    """A scaled rope rotates each position the same way in a 1-token step and in a W-token verify: both workers
    stay token-identical to target-only past the original context."""
    target = near_bigram_target(seed=9, mix=0.5, rope_scaling=rope)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [4, 5]]
    sp = SamplingParams(max_new_tokens=30, return_logprob=True)
    base = Engine(target, max_seq_len=96).generate(prompts, sp)
    for draft, spec in ((random_eagle_head(target, seed=2), SpecConfig(3, 2, 6)), (random_mtp(target, 3, True),
                                                                                    SpecConfig(3))):
        assert draft.config.rope_scaling == target.config.rope_scaling
        outs = Engine(target, draft, spec, impl="reference", max_seq_len=96).generate(prompts, sp)
        assert_same_as_baseline(outs, base)
