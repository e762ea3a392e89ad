"""Target-only engine: the baseline every speculative result is compared with."""
import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

import reference
from specdec import Engine, SamplingParams, SpecConfig
from specdec.ops.logprob_types import LogitsOutput, SamplingInfo, SpecBatch
from specdec.models import random_llama
from tests.helpers import FALSE_FAILURE_RATE, LOGPROB_ATOL, chi_square_pvalue
from tests.helpers.oracles import softmax_filtered

PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9], [10, 11, 12], [5, 5, 5, 5]]


@pytest.fixture(scope="module")
def target():
    return random_llama(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_key_value_heads=2, seed=3)


def _lp_params(**kw):
    return SamplingParams(max_new_tokens=9, return_logprob=True, top_logprobs_num=4, token_ids_logprob=[3, 0, 3], **kw)


def test_ragged_batch_equals_each_request_alone(target):
    engine = Engine(target, max_seq_len=64)
    params = [_lp_params(), _lp_params(temperature=0.8), _lp_params(temperature=1.3, top_k=5), _lp_params(top_p=0.5)]
    batch = engine.generate(PROMPTS, params, seed=7)
    for i, (p, sp) in enumerate(zip(PROMPTS, params)):
        # a request's random stream is keyed by (seed, its index in the call): dummies in front
        # give request i its index while it shares the batch with nothing of the same length
        alone = engine.generate([[1]] * i + [p], [SamplingParams(max_new_tokens=1)] * i + [sp], seed=7)[i]
        assert alone.token_ids == batch[i].token_ids
        assert max(abs(a - b) for a, b in zip(alone.logprobs, batch[i].logprobs)) <= LOGPROB_ATOL
        for ta, tb in zip(alone.top_logprobs, batch[i].top_logprobs):
            assert [t for _, t in ta] == [t for _, t in tb]


def test_logprobs_match_an_independent_float64_computation(target):
    engine = Engine(target, max_seq_len=64)
    sp = SamplingParams(max_new_tokens=6, temperature=0.7, return_logprob=True, top_logprobs_num=3,
                        token_ids_logprob=[0, 63])
    out = engine.generate([PROMPTS[0]], sp, seed=1)[0]
    seq = PROMPTS[0] + out.token_ids
    with torch.no_grad():
        logits = target(torch.tensor([seq]), torch.arange(len(seq))[None]).logits
    n = len(PROMPTS[0])
    for j, tok in enumerate(out.token_ids):
        row = [float(x) / 0.7 for x in logits[0, n - 1 + j]]
        m = max(row)
        lse = m + math.log(sum(math.exp(x - m) for x in row))
        assert abs(out.logprobs[j] - (row[tok] - lse)) <= LOGPROB_ATOL
        top = sorted(range(64), key=lambda t: -row[t])[:3]
        assert [t for _, t in out.top_logprobs[j]] == top
        assert [t for _, t in out.token_ids_logprobs[j]] == [0, 63]
        assert abs(out.token_ids_logprobs[j][1][0] - (row[63] - lse)) <= LOGPROB_ATOL


def test_engine_logprobs_equal_the_helpers_on_the_same_logits(target):
    """The engine gets its logprobs from compute_spec_v2_logprobs (a one-node path per request)."""
    engine = Engine(target, max_seq_len=64, return_original_logprob=True)
    out = engine.generate([PROMPTS[2]], _lp_params(temperature=0.5), seed=3)[0]
    seq = PROMPTS[2] + out.token_ids
    logits = target(torch.tensor([seq]), torch.arange(len(seq))[None]).logits
    rows = logits[0, len(PROMPTS[2]) - 1:-1]
    n = rows.shape[0]
    lo = reference.compute_spec_v2_logprobs(
        SpecBatch(torch.zeros(n), SamplingInfo(torch.full((n, 1), 0.5), False), [4] * n, [[3, 0, 3]] * n),
        LogitsOutput(rows), torch.tensor(out.token_ids), torch.arange(n)[:, None], 0, return_original_logprob=True)
    assert max(abs(a - b) for a, b in zip(out.logprobs, lo.next_token_logprobs[:, 0].tolist())) <= LOGPROB_ATOL
    assert [[t for _, t in x] for x in out.top_logprobs] == [v.tolist() for v in lo.next_token_top_logprobs_idx]


def test_greedy_is_deterministic_and_seeds_control_sampling(target):
    engine = Engine(target, max_seq_len=64)
    g = SamplingParams(max_new_tokens=12)
    first = [o.token_ids for o in engine.generate(PROMPTS, g)]
    assert first == [o.token_ids for o in engine.generate(PROMPTS, g, seed=5)]
    s = SamplingParams(max_new_tokens=12, temperature=1.5)
    a = [o.token_ids for o in engine.generate(PROMPTS, s, seed=1)]
    assert a == [o.token_ids for o in engine.generate(PROMPTS, s, seed=1)]
    assert a != [o.token_ids for o in engine.generate(PROMPTS, s, seed=2)]
    top1 = SamplingParams(max_new_tokens=12, temperature=1.5, top_k=1)
    assert [o.token_ids for o in engine.generate(PROMPTS, top1, seed=3)] == \
        [o.token_ids for o in engine.generate(PROMPTS, g)]


def test_stop_tokens_and_max_new_tokens(target):
    engine = Engine(target, max_seq_len=64)
    free = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=10))[0]
    stop = free.token_ids[4]
    first = free.token_ids.index(stop)
    sp = SamplingParams(max_new_tokens=10, stop_token_ids=[stop], return_logprob=True)
    out = engine.generate([PROMPTS[0]], sp)[0]
    assert out.token_ids == free.token_ids[:first + 1] and out.finish_reason == "stop"
    assert len(out.logprobs) == len(out.token_ids)
    assert free.finish_reason == "length" and len(free.token_ids) == 10


# (1.0, 5, 0.6): top-p over the renormalised top-5 keeps 3 tokens; over the original probabilities
# (the other order, or one joint filter) it would keep 5.
@pytest.mark.parametrize("temperature, top_k, top_p",
                         [(1.0, -1, 1.0), (0.6, -1, 1.0), (1.0, 3, 1.0), (1.2, -1, 0.7), (1.0, 5, 0.6)])
def test_first_token_is_distributed_as_the_filtered_softmax(temperature, top_k, top_p):
    """Chi-square goodness of fit of N sampled first tokens against softmax(logits / T) after the
    top-k / top-p filter (exact, float64); false-failure rate FALSE_FAILURE_RATE per case."""
    t = random_llama(vocab_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, seed=11, init_std=0.1)
    prompt = [1, 2, 3]
    logits = t(torch.tensor([prompt]), torch.arange(3)[None]).logits
    probs = softmax_filtered(logits[0, -1].tolist(), temperature, top_k, top_p)
    N = 4000
    engine = Engine(t, max_batch=N, max_seq_len=8)
    outs = engine.generate([prompt] * N, SamplingParams(max_new_tokens=1, temperature=temperature, top_k=top_k,
                                                        top_p=top_p), seed=123)
    counts = [0] * 8
    for o in outs:
        counts[o.token_ids[0]] += 1
    assert chi_square_pvalue(counts, probs) > FALSE_FAILURE_RATE, (counts, probs)


BAD = [
    ([[]], SamplingParams(), "request 0: the prompt must be a non-empty"),
    ([[1], [64]], SamplingParams(), r"request 1: prompt\[0\] must be an int in \[0, 63\], got 64"),
    ([[1], [-1]], SamplingParams(), r"request 1: prompt\[0\] must be an int in \[0, 63\], got -1"),
    ([[1]], SamplingParams(max_new_tokens=0), "request 0: max_new_tokens must be an int >= 1, got 0"),
    ([[1]], SamplingParams(temperature=-0.5), "request 0: temperature must be finite and >= 0, got -0.5"),
    ([[1]], SamplingParams(temperature=float("inf")), "request 0: temperature must be finite and >= 0, got inf"),
    ([[1]], SamplingParams(temperature=float("nan")), "request 0: temperature must be a number, got nan"),
    ([[1]], SamplingParams(temperature=None), "request 0: temperature must be a number, got NoneType None"),
    ([[1]], SamplingParams(temperature="0.5"), "request 0: temperature must be a number, got str '0.5'"),
    ([[1]], SamplingParams(top_p=None), "request 0: top_p must be a number"),
    ([[1]], SamplingParams(top_k=True), "request 0: top_k must be an int >= -1, got bool True"),
    ([[1]], SamplingParams(max_new_tokens=True), "request 0: max_new_tokens must be an int >= 1, got bool"),
    ([[1]], SamplingParams(max_new_tokens=2.0), "request 0: max_new_tokens must be an int >= 1, got float"),
    ([[1]], SamplingParams(stop_token_ids=5), "request 0: stop_token_ids must be a list of token ids, got int 5"),
    ([[1]], SamplingParams(stop_token_ids=None), "request 0: stop_token_ids must be a list of token ids"),
    ([[1]], SamplingParams(token_ids_logprob=5), "request 0: token_ids_logprob must be a list of token ids"),
    ([[1]], SamplingParams(token_ids_logprob=torch.tensor([3])), "request 0: token_ids_logprob must be a list"),
    ([[1]], SamplingParams(token_ids_logprob=[True]), r"request 0: token_ids_logprob\[0\] .*, got bool True"),
    ([[1]], SamplingParams(return_logprob="no"), "request 0: return_logprob must be True or False, got str"),
    ([[1, 2.0]], SamplingParams(), r"request 0: prompt\[1\] must be an int in \[0, 63\], got float 2.0"),
    ([[1, True]], SamplingParams(), r"request 0: prompt\[1\] must be an int in \[0, 63\], got bool True"),
    ([[1]], SamplingParams(top_p=0.0), r"request 0: top_p must be in \(0, 1\], got 0.0"),
    ([[1]], SamplingParams(top_p=1.5), "got 1.5"),
    ([[1]], SamplingParams(top_k=0), "request 0: top_k must be -1 .* got 0"),
    ([[1]], SamplingParams(top_k=-2), "got -2"),
    ([[1]], SamplingParams(top_logprobs_num=-1), r"request 0: top_logprobs_num must be an int in \[0, 64\], got -1"),
    ([[1]], SamplingParams(top_logprobs_num=65), r"request 0: top_logprobs_num must be an int in \[0, 64\], got 65"),
    ([[1]], SamplingParams(token_ids_logprob=[70]), r"request 0: token_ids_logprob\[0\] must be an int .*, got 70"),
    ([[1] * 30], SamplingParams(max_new_tokens=40), "request 0: prompt length 30 \\+ max_new_tokens 40 = 70 exceeds"),
    ([[1]] * 5, SamplingParams(), "a batch of 5 requests exceeds the cache: 4 of 4 slots free"),
]


@pytest.mark.parametrize("prompts, params, match", BAD)
def test_bad_input_is_a_value_error_and_the_engine_keeps_serving(target, prompts, params, match):
    engine = Engine(target, max_batch=4, max_seq_len=64)
    before = engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=5))[0].token_ids
    with pytest.raises(ValueError, match=match):
        engine.generate(prompts, params)
    assert engine.worker.cache.num_free == 4
    assert engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=5))[0].token_ids == before


@pytest.mark.parametrize("seed", [None, 1.5, "7", True])
def test_a_bad_seed_is_a_value_error(target, seed):
    engine = Engine(target, max_batch=4, max_seq_len=64)
    with pytest.raises(ValueError, match="seed must be an int"):
        engine.generate([[1]], SamplingParams(temperature=0.7), seed=seed)
    assert engine.worker.cache.num_free == 4


def test_numpy_integers_are_the_ints_they_are(target):
    import numpy as np
    engine = Engine(target, max_batch=4, max_seq_len=64)
    sp = SamplingParams(max_new_tokens=5, temperature=0.8, top_k=np.int64(20), stop_token_ids=[np.int32(63)],
                        token_ids_logprob=[np.int64(2)], return_logprob=True)
    want = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=5, temperature=0.8, top_k=20,
                                                      stop_token_ids=[63], token_ids_logprob=[2],
                                                      return_logprob=True), seed=3)
    got = engine.generate([[np.int64(1), np.int32(2), 3]], sp, seed=np.int64(3))
    assert got[0].token_ids == want[0].token_ids and got[0].logprobs == want[0].logprobs


@pytest.mark.parametrize("temperature", [1e-7, 1e-39, 1e-50])
def test_a_temperature_below_1e_6_decodes_greedily(target, temperature):
    """SGLang's rule: such temperatures would overflow fp32 (1e-39) or round to 0 (1e-50)."""
    engine = Engine(target, max_batch=4, max_seq_len=64)
    greedy = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, return_logprob=True), seed=5)
    tiny = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=temperature, return_logprob=True),
                           seed=5)
    for a, b in zip(tiny, greedy):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


def test_bad_engine_arguments(target):
    with pytest.raises(ValueError, match="impl must be"):
        Engine(target, impl="cuda")
    with pytest.raises(ValueError, match="needs a SpecConfig"):
        Engine(target, draft=object())
    with pytest.raises(ValueError, match="max_batch"):
        Engine(target, max_batch=0)
    with pytest.raises(ValueError, match="max_batch must be an int >= 1, got bool True"):
        Engine(target, max_batch=True)
    with pytest.raises(ValueError, match="max_seq_len=1000000000 exceeds the target's max_position_embeddings=2048"):
        Engine(target, max_seq_len=10 ** 9)
    big = random_llama(vocab_size=64, hidden_size=32, num_hidden_layers=2, max_position_embeddings=2 ** 40)
    with pytest.raises(ValueError, match="KV cache for max_batch=16, max_seq_len=1099511627776 .* could not be "
                                         "allocated"):  # a ValueError from the cache, not the allocator's error
        Engine(big, max_batch=16, max_seq_len=2 ** 40, preallocate=True)


class _CountHostReads(TorchFunctionMode):
    READS = frozenset({"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero"})

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["target-only", "eagle", "mtp"])
def test_the_engine_reads_the_device_once_per_step(kind):
    """Accepted lengths, tokens and every requested logprob field come back in one transfer per step
    (it used to be about 56 reads per step at B=8 with top-k and token-id logprobs)."""
    from tests.helpers import near_bigram_target, perfect_eagle, perfect_mtp
    t = near_bigram_target(seed=5, mix=0.3)
    draft, spec = {"target-only": (None, None), "eagle": (perfect_eagle(t), SpecConfig(3, 2, 6)),
                   "mtp": (perfect_mtp(t, 2, False), SpecConfig(2))}[kind]
    engine = Engine(t, draft, spec, impl="reference", max_batch=8, max_seq_len=64)
    params = [SamplingParams(max_new_tokens=9 + i, return_logprob=True, top_logprobs_num=3, token_ids_logprob=[1, 4],
                             temperature=0.8 * (i % 2)) for i in range(8)]
    with _CountHostReads() as reads:
        engine.generate([[1 + i, 2, 3] for i in range(8)], params)
    assert reads.count == engine.last_stats.num_decode_steps + 1  # + the prefill's step


def test_uniforms_land_on_any_device():
    """The per-request uniforms follow the worker's device, whatever it is (meta here; MPS or XPU alike)."""
    from specdec.sampling import RequestRNG
    u = RequestRNG(0, 3).uniforms(4, "meta")
    assert u.device.type == "meta" and u.shape == (3, 4)
