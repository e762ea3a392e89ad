"""The deep pair (`zoo.DEEP_NAME`, a 24-layer target at hidden 128 and its drafts): what the small pair's
losslessness tests hold, held here too, against target-only decoding, transformers' `generate` and the
exact distribution."""
import pytest

from specdec import Engine, SamplingParams, SpecConfig, zoo
from specdec.lab import target_law
from specdec.zoo.corpus import heldout_prompts
from tests.helpers import FALSE_FAILURE_RATE, LOGPROB_ATOL, sampled_sequences_pvalue

CASES = {"EAGLE tree S5 K4 W16": ("eagle", SpecConfig(5, 4, 16)),
         "EAGLE-3 tree S5 K4 W16": ("eagle3", SpecConfig(5, 4, 16)),
         "EAGLE chain S3": ("eagle", SpecConfig(3, 1)), "EAGLE-3 chain S3": ("eagle3", SpecConfig(3, 1)),
         "MTP MiMo S3": ("mtp", SpecConfig(3)), "MTP Step-3.5 S3": ("mtp_chain", SpecConfig(3)),
         "STANDALONE chain S3": ("draft_lm", SpecConfig(3, 1)), "DFlash block 8": ("dflash", SpecConfig(7)),
         "DSpark block 7": ("dspark", SpecConfig(7))}


@pytest.fixture(scope="module")
def deep():
    if zoo.DEEP_NAME not in zoo.names():
        pytest.fail(f"the deep pair {zoo.DEEP_NAME!r} does not ship; names() = {zoo.names()}")
    return zoo.load(zoo.DEEP_NAME)


@pytest.fixture(scope="module")
def greedy_baseline(deep):
    prompts = heldout_prompts(2, 64, seed=5)
    params = SamplingParams(max_new_tokens=24, return_logprob=True)
    return prompts, params, Engine(deep.target, impl="reference").generate(prompts, params)


def test_the_deep_pair_is_deep_narrow_trained_and_fits(deep):
    cfg = deep.target.config
    assert (cfg.num_hidden_layers, cfg.hidden_size) == (24, 128)
    small = zoo.load("stdlib-byte-6l").card["heldout"]["target"]["heldout_nats_per_byte"]
    assert deep.card["heldout"]["target"]["heldout_nats_per_byte"] <= 1.1 * small
    assert sum(f.stat().st_size for f in deep.path.rglob("*") if f.is_file()) <= 20e6
    e3, trained = deep.eagle3, deep.card["training"]["eagle3"]
    # layers 16 and 20 and the last layer's output, each normed before fc, as the card records its training
    assert list(e3.feature_layers) == trained["feature_layers"] == [16, 20, 24]
    assert e3.config.fc_norm and trained["fc_norm"] and not e3.config.norm_output
    # the whole vocabulary: the identity draft-to-target map
    assert e3.config.draft_vocab_size == cfg.vocab_size == trained["draft_vocab_size"]
    assert not e3.d2t.any() and e3.t2d.all()
    assert zoo.speed_pair() == zoo.DEEP_NAME


def test_target_only_equals_transformers_generate(deep, greedy_baseline):
    pytest.importorskip("transformers")
    from specdec.bench.peers import HFGenerate
    prompts, params, base = greedy_baseline
    hf = HFGenerate(deep.path / "target").generate(prompts, SamplingParams(max_new_tokens=params.max_new_tokens))
    assert [o.token_ids for o in hf] == [o.token_ids for o in base]


@pytest.mark.parametrize("name", CASES)
def test_every_worker_is_greedy_lossless_on_the_deep_pair(deep, greedy_baseline, name):
    kind, spec = CASES[name]
    prompts, params, base = greedy_baseline
    outs = Engine(deep.target, getattr(deep, kind), spec, impl="reference").generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in base]
    assert max(abs(x - y) for o, b in zip(outs, base) for x, y in zip(o.logprobs, b.logprobs)) <= LOGPROB_ATOL
    assert sum(a for o in outs for a in o.accept_lens) > 1.5 * sum(len(o.accept_lens) for o in outs)


# the fast path's losslessness is CI's on smaller models (test_fast_workers); the 24-layer pair runs with -m slow
@pytest.mark.slow
@pytest.mark.parametrize("name", ["EAGLE tree S5 K4 W16", "MTP Step-3.5 S3"])
def test_the_fast_path_is_greedy_lossless_on_the_deep_pair(deep, name):
    kind, spec = CASES[name]
    prompts = heldout_prompts(1, 48, seed=6)
    params = SamplingParams(max_new_tokens=6, return_logprob=True)
    base = Engine(deep.target, impl="reference").generate(prompts, params)
    outs = Engine(deep.target, getattr(deep, kind), spec, impl="fast").generate(prompts, params)
    assert outs[0].token_ids == base[0].token_ids
    assert max(abs(x - y) for x, y in zip(outs[0].logprobs, base[0].logprobs)) <= LOGPROB_ATOL


# CI keeps the tree at 1200 draws; the MTP chain's law is test_workers' sampling cases' too, and it and 3000 draws
# run with -m slow
@pytest.mark.parametrize("name, N", [("EAGLE tree S5 K4 W16", 1200),
                                     pytest.param("EAGLE tree S5 K4 W16", 3000, marks=pytest.mark.slow),
                                     pytest.param("MTP MiMo S3", 3000, marks=pytest.mark.slow)])
def test_the_deep_pair_samples_the_targets_distribution(deep, name, N):
    kind, spec = CASES[name]
    spec = SpecConfig(2, spec.topk, min(spec.num_draft_tokens, 6)) if kind == "eagle" else SpecConfig(3)
    prompt = list(b"    def __init__(self, ")
    n_tokens, temperature = 3, 1.0
    exact = target_law(deep.target, prompt, n_tokens, SamplingParams(temperature=temperature), floor=1e-5)
    engine = Engine(deep.target, getattr(deep, kind), spec, impl="reference", max_batch=N, max_seq_len=40)
    outs = engine.generate([prompt] * N, SamplingParams(max_new_tokens=n_tokens, temperature=temperature), seed=11)
    assert sum(a for o in outs for a in o.accept_lens) > 1.3 * sum(len(o.accept_lens) for o in outs)
    assert sampled_sequences_pvalue(outs, exact) > FALSE_FAILURE_RATE

