"""`specdec bench --suite draft-vocab` on a small bundle: every draft that takes a vocabulary, one row per size, the
ratios against the same draft's whole vocabulary, and the results page's table of it."""
import numpy as np
import pandas as pd
import pytest

from specdec.bench.suites.draft_vocab import run_draft_vocab, vocabulary_kinds
from specdec.bench.report.results_page import draft_vocab_section
from specdec.models import random_eagle_head
from specdec.models.bigram import near_bigram_target, perfect_eagle
from specdec.models.llama import random_draft_lm
from specdec.zoo import Bundle

V = 48


@pytest.fixture
def bundle(tmp_path):
    target = near_bigram_target(seed=3, mix=0.4, vocab_size=V, num_hidden_layers=2)
    np.save(tmp_path / "token_ranking.npy", np.random.default_rng(0).permutation(V).astype(np.int32))
    drafts = {"eagle": perfect_eagle(target), "draft_lm": random_draft_lm(target, seed=2)}
    return Bundle(name="tiny", target=target, drafts=drafts, path=tmp_path)


def test_each_draft_runs_at_each_vocabulary_beside_target_only(bundle, tmp_path):
    assert vocabulary_kinds(bundle) == ["eagle", "draft_lm"]
    path = run_draft_vocab(bundle, [None, 12], [[1, 2, 3], [7, 5]], 10, 1, [], tmp_path / "out",
                           progress=lambda s: None)
    df = pd.read_csv(path, keep_default_na=False)
    assert list(df["worker"]) == ["", "eagle", "eagle", "draft_lm", "draft_lm"]
    assert list(df["draft_vocab_size"]) == [0, V, 12, V, 12]
    assert (df["same_tokens_as_target_only"].astype(str) == "True").all()
    whole = df[(df["worker"] == "eagle") & (df["draft_vocab_size"] == V)].iloc[0]
    small = df[(df["worker"] == "eagle") & (df["draft_vocab_size"] == 12)].iloc[0]
    # the perfect head loses what its 12 ids cannot propose
    assert float(small["mean_accept_len"]) < float(whole["mean_accept_len"])
    assert float(small["accept_vs_whole_vocab"]) == pytest.approx(
        float(small["mean_accept_len"]) / float(whole["mean_accept_len"]), abs=1e-3)
    assert float(whole["accept_vs_whole_vocab"]) == 1.0
    table = "\n".join(draft_vocab_section(path))
    assert "| EAGLE | 12 |" in table and "| STANDALONE | 48 |" in table
    assert "token-identical to target-only: yes" in table


def test_the_suite_names_a_draft_the_bundle_lacks(bundle, tmp_path):
    bundle.drafts["eagle"] = random_eagle_head(bundle.target)
    with pytest.raises(ValueError, match=r"--workers \['eagle3'\]"):
        run_draft_vocab(bundle, [None], [[1, 2]], 4, 1, [], tmp_path, kinds=["eagle3"])
    with pytest.raises(ValueError, match=r"--vocab-sizes \[49\]"):
        run_draft_vocab(bundle, [49], [[1, 2]], 4, 1, [], tmp_path)
