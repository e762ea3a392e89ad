"""Token maps (`specdec.token_map`, `Engine(token_map=)`): an EAGLE head or a STANDALONE draft LM proposing from a
hot vocabulary only, lossless against target-only decoding; SGLang's file format; bad maps refused in one line."""
from collections import Counter

import numpy as np
import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig
from specdec.lab import target_law
from specdec.models import random_eagle_head
from specdec.models.bigram import near_bigram_target, perfect_eagle
from specdec.models.llama import random_draft_lm
from specdec.token_map import check_token_map, load_token_map, rank_token_ids, save_token_map
from tests.helpers import FALSE_FAILURE_RATE, assert_same_as_baseline, chi_square_pvalue, logprob_params

V = 64


def _target():
    return near_bigram_target(seed=3, mix=0.4, vocab_size=V, num_hidden_layers=3)


def _draft(kind, target):
    return random_eagle_head(target, seed=1) if kind == "eagle" else random_draft_lm(target, seed=2)


#: a map that is not sorted, so that draft id d != its rank among the hot ids
HOT = torch.randperm(V, generator=torch.Generator().manual_seed(7))[:23]


@pytest.mark.parametrize("kind", ["eagle", "draft_lm"])
@pytest.mark.parametrize("spec", [SpecConfig(3, 1), SpecConfig(3, 4, 10)])
def test_a_draft_with_a_token_map_is_lossless(kind, spec):
    target = _target()
    prompts = [[1, 2, 3, 4, 5], [9, 8], [7] * 11]
    sp = logprob_params(max_new=16)
    base = Engine(target, max_seq_len=64).generate(prompts, sp)
    outs = Engine(target, _draft(kind, target), spec, max_seq_len=64, token_map=HOT).generate(prompts, sp)
    assert_same_as_baseline(outs, base)


@pytest.mark.parametrize("kind", ["eagle", "draft_lm"])
def test_the_draft_proposes_the_top_k_of_its_full_logits_restricted_to_the_map(kind):
    """Every proposal of a draft step is a hot id, and the K proposals are the K best hot ids of the draft's own
    full-vocabulary logits (computed here without the worker's head: the full logits with the others at -inf)."""
    target = _target()
    draft = _draft(kind, target)
    engine = Engine(target, draft, SpecConfig(3, 4, 10), max_seq_len=64, token_map=HOT)
    w = engine.worker
    w.prefill([[1, 2, 3, 4, 5], [6]], [SamplingParams(max_new_tokens=30)] * 2, seed=0)
    full_head = draft.lm_head if kind == "draft_lm" else target.lm_head
    outside = torch.ones(V, dtype=torch.bool)
    outside[HOT] = False
    for _ in range(3):
        hidden = w.state.draft_hidden
        expected = full_head(hidden).float().masked_fill(outside, float("-inf")).topk(4, dim=-1).indices
        assert torch.equal(w.state.topk_index, expected)
        _, token_list, _ = w.draft_forward()
        assert set(torch.cat([t.flatten() for t in token_list]).tolist()) <= set(HOT.tolist())
        w.decode_step()


def test_a_map_without_the_targets_tokens_accepts_nothing_and_changes_nothing():
    target = _target()
    prompts = [[1, 2, 3]]
    sp = SamplingParams(max_new_tokens=12)
    base = Engine(target, max_seq_len=64).generate(prompts, sp)
    said = set(base[0].token_ids)
    cold = [i for i in range(V) if i not in said][:8]
    perfect = perfect_eagle(target)
    outs = Engine(target, perfect, SpecConfig(3, 1), max_seq_len=64, token_map=cold).generate(prompts, sp)
    assert outs[0].token_ids == base[0].token_ids and set(outs[0].accept_lens) == {1}
    hot = Engine(target, perfect, SpecConfig(3, 1), max_seq_len=64, token_map=sorted(said)).generate(prompts, sp)
    assert hot[0].token_ids == base[0].token_ids and max(hot[0].accept_lens) > 1


@pytest.mark.parametrize("verify", ["target_only", "rejection"])
def test_sampling_with_a_token_map_follows_the_targets_distribution(verify):
    """Rejection sampling reads the draft's q over the hot ids scattered to the target's vocabulary (zero mass
    elsewhere): the joint law of three sampled tokens against enumeration."""
    Vs = 6
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=Vs, hidden_size=16, num_attention_heads=2, init_std=0.3)
    spec = SpecConfig(2, 2, 5, draft_sampling="sample", verify=verify)
    prompt, n_tokens, N = [1, 2], 3, 4000
    engine = Engine(target, perfect_eagle(target), spec, max_batch=N, max_seq_len=12, token_map=[4, 1, 2])
    outs = engine.generate([prompt] * N, SamplingParams(max_new_tokens=n_tokens, temperature=1.0), seed=11)
    counts = Counter(tuple(o.token_ids) for o in outs)
    accepted = [a for o in outs for a in o.accept_lens]
    assert any(a > 1 for a in accepted) and any(a == 1 for a in accepted)
    exact = target_law(target, prompt, n_tokens, SamplingParams(temperature=1.0))
    assert chi_square_pvalue(counts, exact) > FALSE_FAILURE_RATE


def test_a_token_map_on_the_fast_path_equals_the_reference():
    pytest.importorskip("triton")
    target = _target()
    head = _draft("eagle", target)
    prompts = [[1, 2, 3, 4, 5], [9, 8]]
    sp = SamplingParams(max_new_tokens=8, return_logprob=True)
    ref = Engine(target, head, SpecConfig(2, 2, 4), impl="reference", max_seq_len=32, token_map=HOT)
    fast = Engine(target, head, SpecConfig(2, 2, 4), impl="fast", max_seq_len=32, token_map=HOT)
    assert_same_as_baseline(fast.generate(prompts, sp), ref.generate(prompts, sp))


def test_a_token_map_file_in_sglangs_format_round_trips(tmp_path):
    """SGLang reads `torch.load(path)` of a list of ids (FR-Spec's files) or of a tensor; order is kept."""
    ids = [5, 3, 60, 0]
    listed = save_token_map(ids, tmp_path / "hot.pt", V)
    assert torch.load(listed, weights_only=True) == ids
    torch.save(torch.tensor(ids, dtype=torch.int32), tmp_path / "tensor.pt")
    for path in (listed, tmp_path / "tensor.pt", str(listed)):
        assert load_token_map(path, V).tolist() == ids
    target = _target()
    a = Engine(target, _draft("eagle", target), SpecConfig(3, 1), max_seq_len=32, token_map=listed)
    assert a.worker.draft_model.hot_ids.tolist() == ids


def test_rank_token_ids_orders_by_count_then_id():
    stream = [4, 2, 4, 9, 2, 4, 7]
    counts = Counter(stream)
    expected = sorted(range(12), key=lambda i: (-counts[i], i))
    assert rank_token_ids(stream, 12).tolist() == expected
    assert rank_token_ids(np.array(stream, dtype=np.int32), 12).tolist() == expected
    with pytest.raises(ValueError, match="id 12 outside"):
        rank_token_ids([1, 12], 12)


@pytest.mark.parametrize("ids, match", [
    ([3, 5, 3], "id 3 more than once"),
    ([1, V], f"id {V} outside the target's vocabulary"),
    ([-1, 2], "id -1 outside"),
    (list(range(V)) + [0], f"{V + 1} ids, more than the target's vocabulary of {V}"),
    ([], "is empty"),
    ([1.0, 2.0], "integer token ids"),
    ([[1, 2]], "1-D"),
    ("missing.pt", "'missing.pt' is not a file"),
    (object(), "list of token ids"),
])
def test_a_bad_token_map_is_one_line_naming_it(ids, match):
    target = _target()
    with pytest.raises(ValueError, match=match) as e:
        Engine(target, _draft("eagle", target), SpecConfig(3, 1), max_seq_len=32, token_map=ids)
    assert "\n" not in str(e.value)


def test_a_file_that_is_no_token_map_is_one_line(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a pickle")
    torch.save({"ids": [1, 2]}, tmp_path / "dict.pt")
    for name, match in (("junk.pt", "cannot be read"), ("dict.pt", "list of token ids")):
        with pytest.raises(ValueError, match=match) as e:
            load_token_map(tmp_path / name, V)
        assert "\n" not in str(e.value) and name in str(e.value)


def test_drafts_without_the_targets_lm_head_refuse_a_token_map():
    from specdec.models import random_eagle3_head
    target = _target()
    with pytest.raises(ValueError, match="EAGLE-3 drafts"):
        Engine(target, random_eagle3_head(target, draft_vocab_size=23), SpecConfig(3, 1), token_map=[1, 2])
    with pytest.raises(ValueError, match="needs a draft model"):
        Engine(target, token_map=[1, 2])
    assert check_token_map(torch.tensor([2, 1]), V).tolist() == [2, 1]


def test_the_token_map_command_writes_the_most_frequent_ids_of_a_corpus(tmp_path, capsys):
    from specdec.cli import main
    from specdec.tokenizer import ByteTokenizer
    text = "aaaa bbb cc d\n"
    (tmp_path / "corpus.txt").write_text(text)
    out = tmp_path / "hot.pt"
    assert main(["token-map", "--model", "stdlib-byte-6l", "--corpus", str(tmp_path / "corpus.txt"), "--size", "4",
                 "--out", str(out)]) == 0
    counts = Counter(ByteTokenizer().encode(text))
    assert torch.load(out, weights_only=True) == sorted(counts, key=lambda i: (-counts[i], i))[:4]
    assert main(["token-map", "--model", "stdlib-byte-6l", "--corpus", str(tmp_path / "corpus.txt"), "--size", "259",
                 "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "specdec token-map: error: --size 259 exceeds the target's vocabulary of 258"
