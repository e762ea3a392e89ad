"""EagleWorkerV2 and MultiLayerEagleWorkerV2 against plain target-only decoding."""
import random

import pytest
import torch

import reference
from specdec import Engine, SamplingParams, SpecConfig
from tests.helpers import (LOGPROB_ATOL, always_wrong_eagle, always_wrong_mtp, assert_same_as_baseline, bigram_target,
                           check_sampling_is_lossless, logprob_params, near_bigram_target, perfect_eagle, perfect_mtp)


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
