"""Drafts for a given target: the hidden states recorded while the engine decodes equal a teacher-forced forward of
the same conversations; the recording answers the trainer's losses as the target would; a draft saved for one
target is refused on another; an EAGLE-3 head with the target's LM head rows runs with any draft vocabulary. On the
small byte pair, for speed (the real target's drafts are tested in test_real_drafts.py)."""
import json

import numpy as np
import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig, zoo
from specdec.zoo.train.for_target import (save_target_draft, target_draft_opts, train_target_draft,
                                          unused_token_id)
from specdec.zoo.train.record import RecordedData, RecordedTarget, RecordedWindows, load_recordings, record_responses

LAYERS = (1, 3, 6)


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    return zoo.load(zoo.SMALL_NAME)


@pytest.fixture(scope="module")
def recording(small, tmp_path_factory):
    """Ragged prompts, two greedy and one sampled, a stop byte that ends some answers early (the engine then drops
    their rows), written as `record` writes a directory."""
    tok = small.tokenizer
    prompts = [tok.encode(t) for t in ("def parse(self, text):\n", "import os\nimport sys\n\n", "class A:\n    x = ")]
    toks, feats, starts = record_responses(small.target, prompts, LAYERS, 24, [0.0, 0.0, 0.8], batch_size=3,
                                           stop_token_ids=[ord("\n")], log=lambda s: None)
    out = tmp_path_factory.mktemp("rec")
    np.save(out / "tokens.npy", toks)
    np.save(out / "features.npy", feats)
    np.save(out / "starts.npy", starts)
    (out / "meta.json").write_text(json.dumps({
        "target": zoo.target_fingerprint(small.target), "layers": list(LAYERS), "split": "train", "conversations": 3,
        "max_new_tokens": 24, "sampled_every": 3, "temperature": 0.8, "cpu_seconds": 0.0}))
    return out, prompts, toks, feats, starts


def test_recorded_features_equal_a_teacher_forced_forward(small, recording):
    out, prompts, toks, feats, starts = recording
    ends = list(starts[1:]) + [len(toks)]
    lengths = [e - s for s, e in zip(starts, ends)]
    assert any(n < len(p) + 23 for n, p in zip(lengths, prompts))  # some answer stopped early
    for s, e, p in zip(starts, ends, prompts):
        ids = torch.from_numpy(toks[s:e].astype(np.int64))[None]
        assert ids[0, :len(p)].tolist() == p
        with torch.no_grad():
            ref = small.target(ids, torch.arange(ids.shape[1])[None], features=LAYERS).features[0]
        got = torch.from_numpy(feats[s:e]).float()
        torch.testing.assert_close(got, ref, rtol=2e-3, atol=2e-3)  # float16 storage


def test_greedy_answers_are_the_engines(small, recording):
    out, prompts, toks, _, starts = recording
    eng = Engine(small.target, max_batch=1, max_seq_len=128)
    answer = eng.generate([prompts[0]], SamplingParams(max_new_tokens=24, stop_token_ids=[ord("\n")]))[0].token_ids
    assert toks[starts[0]:starts[1]].tolist() == prompts[0] + answer[:-1]  # the last token is never read


def test_recorded_target_answers_as_the_target(small, recording):
    """The recording's teacher over a window (here the whole stream: one window of N - 1 tokens starts at 0) gives
    the logits, final hidden and features the target computes over each conversation on its own."""
    out, _, toks, _, starts = recording
    rec = load_recordings(str(out))
    teacher = RecordedTarget(small.target, rec.layers)
    n = len(toks) - 1
    ids = RecordedWindows(rec, teacher, 1, n, seed=0).next()
    assert ids[0].tolist() == toks[:n].tolist()
    with torch.no_grad():
        got = teacher(ids[:, :n - 2], None, features=(3, 1))
        ref = [small.target(torch.from_numpy(toks[s:e].astype(np.int64))[None], torch.arange(e - s)[None],
                            features=(3, 1))
               for s, e in zip(starts, list(starts[1:]) + [len(toks)])]
    cat = lambda field: torch.cat([getattr(r, field)[0] for r in ref])[None, :n - 2]  # noqa: E731
    torch.testing.assert_close(got.logits, cat("logits"), rtol=1e-2, atol=2e-2)  # float16 storage
    assert (got.logits.argmax(-1) == cat("logits").argmax(-1)).float().mean() > 0.99
    torch.testing.assert_close(got.hidden, cat("hidden"), rtol=5e-3, atol=5e-3)
    torch.testing.assert_close(got.features, cat("features"), rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match="prefix of"):
        teacher(ids.flip(1), None)
    with pytest.raises(ValueError, match=r"not \[2\]"):
        teacher(ids, None, features=(2,))


def test_a_recording_of_another_target_is_refused(small, recording):
    other = zoo.load(zoo.DEEP_NAME).target
    with pytest.raises(ValueError, match="written by target"):
        RecordedData(other, str(recording[0]))


def test_a_draft_saved_for_one_target_is_refused_on_another(small, recording, tmp_path):
    data = RecordedData(small.target, str(recording[0]))
    opts = target_draft_opts(small.target, unused_token_id(small.tokenizer, data.stream))["eagle"]
    opts.steps, opts.warmup, opts.batch_size, opts.seq_len = 2, 1, 2, 16
    row = train_target_draft(small.target, "eagle", data, opts, tmp_path, None, log=lambda s: None)
    assert row["training"]["data"]["conversations"] == 3
    card = json.loads((tmp_path / "card.json").read_text())
    assert card["target_fingerprint"] == zoo.target_fingerprint(small.target)
    assert zoo.load_draft_for("eagle", tmp_path / "eagle", small.target) is not None
    # a target of the same shape with other weights
    other = zoo.load(zoo.SMALL_NAME).target
    with torch.no_grad():
        other.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    with pytest.raises(ValueError, match="was trained for target"):
        zoo.load_draft_for("eagle", tmp_path / "eagle", other)


def test_the_fingerprint_does_not_depend_on_the_dtype(small):
    assert zoo.target_fingerprint(small.target) == zoo.target_fingerprint(
        zoo.load(zoo.SMALL_NAME, dtype=torch.bfloat16).target)


def test_an_eagle3_head_with_the_targets_rows_runs_with_any_vocabulary(small):
    """Its logits over a re-sliced vocabulary are the target's LM head rows applied to its normed output, and the
    engine decodes target-only's tokens with each vocabulary; a head whose LM head was trained is refused."""
    from specdec.zoo.train.stages import new_eagle3_head
    target = small.target
    V = target.config.vocab_size
    head = new_eagle3_head(target, torch.arange(0, V, 2), [1, 3, 6], seed=3).eval()
    for ids in (torch.arange(V), torch.tensor([5, 1, 9, 40, 33])):
        re = head.with_draft_vocabulary(ids)
        assert re.config.draft_vocab_size == len(ids)
        h = torch.randn(2, 3, target.config.hidden_size)
        want = torch.nn.functional.linear(head.norm(h), target.lm_head.weight[ids.sort().values])
        torch.testing.assert_close(re.compute_logits(h), want)
        assert re.draft_to_target(torch.arange(len(ids))).tolist() == ids.sort().values.tolist()
    prompt = small.tokenizer.encode("def main(argv):\n")
    base = Engine(target, max_batch=1, max_seq_len=96).generate([prompt], SamplingParams(max_new_tokens=20))[0]
    for n in (V, 64):
        eng = Engine(target, head.with_draft_vocabulary(torch.arange(n)), SpecConfig(3, 2, 4), max_batch=1,
                     max_seq_len=96)
        assert eng.generate([prompt], SamplingParams(max_new_tokens=20))[0].token_ids == base.token_ids
    with pytest.raises(ValueError, match="distinct ids"):
        head.with_draft_vocabulary(torch.tensor([1, 1, 2]))
    with pytest.raises(ValueError, match="distinct ids"):
        head.with_draft_vocabulary(torch.arange(V + 1))
    with torch.no_grad():
        head.lm_head.weight.add_(0.1)
    with pytest.raises(ValueError, match="LM head rows are not the target's"):
        head.with_draft_vocabulary(torch.arange(V))


def test_save_target_draft_writes_float16_in_the_peer_layout(small, tmp_path):
    from specdec.models.io import read_config
    from specdec.zoo.train.stages import new_eagle3_head
    head = new_eagle3_head(small.target, torch.arange(100), [1, 3, 6], seed=1)
    save_target_draft(head, tmp_path, "abc")
    cfg = read_config(tmp_path)
    assert cfg["torch_dtype"] == "float16" and cfg["specdec_target_fingerprint"] == "abc"
    assert cfg["draft_vocab_size"] == 100 and cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 5]
    from safetensors.torch import load_file
    sd = load_file(str(tmp_path / "model.safetensors"))
    assert {v.dtype for k, v in sd.items() if v.is_floating_point()} == {torch.float16}
    assert {"d2t", "t2d"} <= set(sd)


def test_a_trained_eagle3_head_reslices_to_the_most_frequent_ids(small, recording, tmp_path):
    from specdec.zoo.train.for_target import reslice_eagle3, write_token_ranking
    data = RecordedData(small.target, str(recording[0]))
    opts = target_draft_opts(small.target, unused_token_id(small.tokenizer, data.stream))["eagle3"]
    opts.steps, opts.warmup, opts.batch_size, opts.seq_len = 2, 1, 2, 16
    opts.extra.update(draft_vocab_size=120, feature_layers=[1, 3, 6])
    train_target_draft(small.target, "eagle3", data, opts, tmp_path, None, log=lambda s: None)
    write_token_ranking(tmp_path, data.stream, small.target.config.vocab_size)
    entry = reslice_eagle3(small.target, tmp_path, 50)
    assert (entry["from_draft_vocab_size"], entry["draft_vocab_size"]) == (120, 50)
    head = zoo.load_draft_for("eagle3", tmp_path / "eagle3", small.target)
    counts = np.bincount(data.stream, minlength=small.target.config.vocab_size)
    top = np.sort(np.lexsort((np.arange(len(counts)), -counts))[:50])
    assert head.draft_to_target(torch.arange(50)).tolist() == top.tolist()
    torch.testing.assert_close(head.lm_head.weight, small.target.lm_head.weight[torch.from_numpy(top)].half().float())
    assert json.loads((tmp_path / "card.json").read_text())["drafts"]["eagle3"]["reslice"]["draft_vocab_size"] == 50


def test_a_stopped_run_resumes_to_the_uninterrupted_weights(small, recording, tmp_path):
    import time

    from safetensors.torch import load_file

    data = RecordedData(small.target, str(recording[0]))

    def opts(**kw):
        o = target_draft_opts(small.target, unused_token_id(small.tokenizer, data.stream))["eagle"]
        o.steps, o.warmup, o.batch_size, o.seq_len = 5, 1, 2, 16
        for k, v in kw.items():
            setattr(o, k, v)
        return o

    quiet = lambda s: None  # noqa: E731
    train_target_draft(small.target, "eagle", data, opts(), tmp_path / "whole", None, log=quiet)
    ckpt = str(tmp_path / "eagle.pt")
    row = train_target_draft(small.target, "eagle", data, opts(checkpoint=ckpt, deadline=time.time()),
                             tmp_path / "parts", None, log=quiet)
    assert row["training"]["complete"] is False and row["training"]["steps_done"] == 1
    assert not (tmp_path / "parts" / "eagle").exists()
    with pytest.raises(ValueError, match="remove it or train with its settings"):
        train_target_draft(small.target, "eagle", data, opts(checkpoint=ckpt, resume=True, steps=6),
                           tmp_path / "parts", None, log=quiet)
    row = train_target_draft(small.target, "eagle", data, opts(checkpoint=ckpt, resume=True), tmp_path / "parts",
                             None, log=quiet)
    assert row["training"]["steps"] == 5 and row["training"]["train_cpu_seconds"] > 0
    a = load_file(tmp_path / "whole" / "eagle" / "model.safetensors")
    b = load_file(tmp_path / "parts" / "eagle" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
