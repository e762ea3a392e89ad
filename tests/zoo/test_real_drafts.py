"""The drafts shipped for the real target (SmolLM2-135M-Instruct): each loads through `zoo.load`, decodes held-out
chat prompts token for token as target-only does (greedy, fp32, the same logprobs), and is refused where it does not
belong: on another target (its fingerprint), with a draft vocabulary larger than the target's. Skipped when the
model's package is not installed."""
import copy
import dataclasses
import json
import shutil

import pytest
import torch

from tests.helpers import installed_gguf
from specdec import Engine, SamplingParams, zoo
from specdec.draft_kinds import DRAFT_KINDS

NAME = "smollm2-135m-instruct"
KINDS = ("eagle3", "eagle", "dflash", "draft_lm", "dspark")

pytestmark = pytest.mark.skipif(installed_gguf() is None,
                                reason=f"SmolLM2 is not installed ({zoo.REAL_TARGETS[NAME].install_command})")


@pytest.fixture(scope="module")
def bundle():
    torch.set_num_threads(1)
    return zoo.load(NAME)


def test_every_kind_ships_within_the_size_budget(bundle):
    assert sorted(bundle.drafts) == sorted(KINDS)
    root = zoo.WEIGHTS_DIR / NAME
    total = sum(f.stat().st_size for k in KINDS for f in (root / k).iterdir())
    assert total <= 60 * 2 ** 20, total
    card = json.loads((root / "card.json").read_text())
    assert card["target_fingerprint"] == zoo.target_fingerprint(bundle.target)
    for kind in KINDS:
        row = card["drafts"][kind]
        assert row["training"]["data"]["split"] == "train" and row["heldout"] and row["command"]


def test_every_kind_decodes_target_only_tokens_and_logprobs(bundle):
    from specdec.zoo.chat_prompts import chat_prompt_ids
    prompts = chat_prompt_ids(bundle.tokenizer, "heldout", 2, seed=5)
    params = SamplingParams(max_new_tokens=24, stop_token_ids=list(bundle.tokenizer.eos_token_ids),
                            return_logprob=True)
    max_len = max(map(len, prompts)) + 64
    base = Engine(bundle.target, max_batch=2, max_seq_len=max_len).generate(prompts, params)
    accepted = {}
    for kind in KINDS:
        draft = bundle.drafts[kind]
        if DRAFT_KINDS[kind].stops_chains:  # DSpark: its whole block, what its training scores, on a shallow copy
            draft = copy.copy(draft)
            draft.confidence_threshold = 0.0
        eng = Engine(bundle.target, draft, DRAFT_KINDS[kind].default_spec(draft), max_batch=2, max_seq_len=max_len)
        outs = eng.generate(prompts, params)
        for o, b in zip(outs, base):
            assert o.token_ids == b.token_ids, kind
            assert max(abs(x - y) for x, y in zip(o.logprobs, b.logprobs)) < 1e-4, kind
        accepted[kind] = sum(a for o in outs for a in o.accept_lens) / sum(len(o.accept_lens) for o in outs)
    # trained drafts, not random ones: each accepts more than the bonus token alone
    assert all(a > 1.2 for a in accepted.values()), accepted


def test_a_draft_for_another_target_is_refused(bundle):
    other = zoo.load(zoo.SMALL_NAME).target
    with pytest.raises(ValueError, match="was trained for target"):
        zoo.load_draft_for("eagle3", zoo.WEIGHTS_DIR / NAME / "eagle3", other)


def test_a_draft_vocabulary_larger_than_the_targets_is_refused(bundle, tmp_path):
    shutil.copytree(zoo.WEIGHTS_DIR / NAME / "eagle3", tmp_path / "eagle3")
    cfg = json.loads((tmp_path / "eagle3" / "config.json").read_text())
    cfg["draft_vocab_size"] = bundle.target.config.vocab_size + 1
    (tmp_path / "eagle3" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="draft_vocab_size"):
        zoo.load_draft_for("eagle3", tmp_path / "eagle3", bundle.target)
    with pytest.raises(ValueError, match="distinct ids"):
        bundle.eagle3.with_draft_vocabulary(torch.arange(bundle.target.config.vocab_size + 1))


def test_train_draft_refuses_a_draft_vocabulary_larger_than_the_targets(capsys):
    from specdec.cli import main
    with pytest.raises(SystemExit):
        main(["zoo", "train-draft", "--target", NAME, "--recordings", "x", "--kind", "eagle3", "--draft-vocab",
              "49153"])
    assert "--draft-vocab must be in [1, 49152]" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("kind,rule", [("eagle3", "target_only"), ("dflash", "target_only"), ("eagle3", "rejection"),
                                       ("dflash", "block")])
def test_sampled_decoding_keeps_the_targets_law(bundle, kind, rule):
    """At temperature 0.7 the joint law of the first three tokens (the 2nd and 3rd from the first speculative verify
    step) of a trained draft's decoding is the target's, computed exactly by enumeration (`specdec.lab.target_law`,
    prefixes of expected count below 1 left out; every sequence with expected count >= 5 a cell, the rest one cell);
    chi-square."""
    from specdec.lab import target_law
    from tests.helpers import FALSE_FAILURE_RATE, sampled_sequences_pvalue
    target, T, N = bundle.target, 0.7, 1500
    prompt = bundle.tokenizer.encode("My favourite module of the Python standard library is")
    exact = target_law(target, prompt, 3, SamplingParams(temperature=T), floor=1.0 / N)
    exact = {s: p for s, p in exact.items() if p * N >= 5}
    draft = bundle.drafts[kind]
    spec = DRAFT_KINDS[kind].default_spec(draft)
    if rule != "target_only":
        spec = dataclasses.replace(spec, draft_sampling="sample", verify=rule)
    eng = Engine(target, draft, spec, max_batch=500, max_seq_len=len(prompt) + 32)
    outs = [o for seed in range(N // 500)
            for o in eng.generate([prompt] * 500, SamplingParams(max_new_tokens=3, temperature=T), seed=seed)]
    assert any(a > 1 for o in outs for a in o.accept_lens)  # drafts were accepted, not only bonus tokens
    assert sampled_sequences_pvalue(outs, exact) > FALSE_FAILURE_RATE
