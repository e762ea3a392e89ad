"""Recording at scale: a prompt file recorded in shards equals, file for file, the same recording interrupted and
resumed; the top-k probabilities kept at each answer token are the target's (a teacher-forced forward); prompt rows
keep none but the last; a later turn follows the target's own answer; a sealed shard's checksums catch a changed
byte; a directory started with other settings is refused; `load_recordings` reads the shards. On the small byte
pair, for speed."""
import json

import numpy as np
import pytest
import torch

from specdec import zoo
from specdec.prompt_files import read_prompts
from specdec.zoo.train.record import load_recordings
from specdec.zoo.train.shards import RecordPlan, record_shards, shard_dir, summary, verify_shard

LAYERS = (1, 3, 6)
TOPK = 4


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    return zoo.load(zoo.SMALL_NAME)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("p") / "p.jsonl"
    rows = [{"category": "coding", "turns": ["def parse(self, text):"]},
            {"category": "coding", "turns": ["import os", "import sys"]},
            {"category": "qa", "turns": ["class A:"]},
            {"category": "qa", "turns": ["x = [1, 2,"]},
            {"category": "qa", "turns": ["for i in range("]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, read_prompts(path)


def plan_for(small, path, n):
    return RecordPlan(str(path), "sha", n, zoo.SMALL_NAME, zoo.target_fingerprint(small.target), LAYERS, TOPK, 12,
                      2, 0.9, 5, shard_size=3, batch_size=2)


def record(small, prompts, out, **kw):
    path, ps = prompts
    return record_shards(small.target, small.tokenizer, plan_for(small, path, len(ps)), ps, out, log=lambda s: None,
                         **kw)


@pytest.fixture(scope="module")
def whole(small, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    record(small, prompts, out)
    return out


def test_an_interrupted_recording_resumes_to_the_same_files(small, prompts, whole, tmp_path):
    calls = []

    def stop_after_first_part(line):
        calls.append(line)
        if len(calls) == 1:
            raise KeyboardInterrupt

    path, ps = prompts
    with pytest.raises(KeyboardInterrupt):
        record_shards(small.target, small.tokenizer, plan_for(small, path, len(ps)), ps, tmp_path,
                      log=stop_after_first_part)
    assert (shard_dir(tmp_path, 0, partial=True) / "part-000.npz").is_file()
    assert not shard_dir(tmp_path, 0).exists()
    record(small, prompts, tmp_path, shards=[1])  # shards in any order, any process
    sealed = record(small, prompts, tmp_path)
    assert [m["shard"] for m in sealed] == [0]
    for k in (0, 1):
        for name in ("tokens", "features", "starts", "topk_ids", "topk_probs"):
            a, b = np.load(shard_dir(whole, k) / f"{name}.npy"), np.load(shard_dir(tmp_path, k) / f"{name}.npy")
            assert np.array_equal(a, b), (k, name)
        verify_shard(shard_dir(tmp_path, k))
    s = summary(tmp_path)
    assert s["shards"] == 2 and s["prompts"] == 5 and s["conversations"] == 6  # one prompt has two turns
    assert s["bytes_per_token"] > 2 * sum(1 for _ in LAYERS) * 64


def conversations(out):
    rec = load_recordings([shard_dir(out, 0), shard_dir(out, 1)])
    starts = np.concatenate([np.load(shard_dir(out, k) / "starts.npy") + (0 if k == 0 else
                             len(np.load(shard_dir(out, 0) / "tokens.npy"))) for k in (0, 1)])
    ends = list(starts[1:]) + [len(rec.tokens)]
    ids = np.concatenate([np.load(shard_dir(out, k) / "topk_ids.npy") for k in (0, 1)])
    probs = np.concatenate([np.load(shard_dir(out, k) / "topk_probs.npy") for k in (0, 1)])
    return [(rec.tokens[s:e], rec.features[s:e], ids[s:e], probs[s:e]) for s, e in zip(starts, ends)]


def test_topk_and_features_are_the_targets_own(small, whole):
    tok = small.tokenizer
    for tokens, feats, ids, probs in conversations(whole):
        x = torch.from_numpy(tokens.astype(np.int64))[None]
        with torch.no_grad():
            out = small.target(x, torch.arange(x.shape[1])[None], features=LAYERS)
        torch.testing.assert_close(torch.from_numpy(np.array(feats)).float(), out.features[0], rtol=2e-3,
                                   atol=2e-3)
        ref_p, ref_i = torch.softmax(out.logits[0].float(), -1).topk(TOPK, -1)
        text = tok.decode(tokens.tolist())
        prompt_len = len(tok.encode(text[:text.rindex("assistant: ") + len("assistant: ")]))
        assert (ids[:prompt_len - 1] == -1).all() and (probs[:prompt_len - 1] == 0).all()
        answer = slice(prompt_len - 1, len(tokens))
        torch.testing.assert_close(torch.from_numpy(probs[answer]).float(), ref_p[answer], rtol=0, atol=1e-3)
        # ids agree wherever the target's probabilities are not tied within float16
        gap = (ref_p[answer][:, :-1] - ref_p[answer][:, 1:]).min(-1).values > 1e-3
        assert gap.any()
        assert np.array_equal(ids[answer][gap.numpy()], ref_i[answer][gap].numpy())


def test_a_second_turn_follows_the_targets_answer(small, whole):
    texts = [small.tokenizer.decode(c[0].tolist()) for c in conversations(whole)]
    first = next(t for t in texts if t.startswith("user: import os\nassistant: ") and "import sys" not in t)
    second = next(t for t in texts if "user: import sys" in t)
    answer = first[len("user: import os\nassistant: "):]
    assert second.startswith(f"user: import os\nassistant: {answer}")


def test_a_changed_byte_and_other_settings_are_refused(small, prompts, whole, tmp_path):
    import shutil
    copy = tmp_path / "s0"
    shutil.copytree(shard_dir(whole, 0), copy)
    a = np.load(copy / "tokens.npy")
    a[3] += 1
    np.save(copy / "tokens.npy", a)
    with pytest.raises(ValueError, match="tokens.npy does not match its checksum"):
        verify_shard(copy)
    path, ps = prompts
    other = plan_for(small, path, len(ps))
    other = type(other)(**{**other.__dict__, "max_new_tokens": 13})
    with pytest.raises(ValueError, match="max_new_tokens: 12, now 13"):
        record_shards(small.target, small.tokenizer, other, ps, whole, log=lambda s: None)


def test_a_sharded_recording_reads_as_one_without_loading_it(small, whole):
    from specdec.zoo.train.record import RecordedData, SegmentedRows

    rec = load_recordings(str(whole))
    assert isinstance(rec.features, SegmentedRows) and len(rec.meta) == 2
    flat = np.concatenate([np.load(shard_dir(whole, k) / "features.npy") for k in (0, 1)])
    assert rec.features.shape == flat.shape and len(rec.tokens) == len(flat)
    rng = np.random.default_rng(0)
    for lo, hi in [(0, len(flat)), (0, 1), (len(flat) - 1, len(flat))] + [sorted(rng.integers(0, len(flat), 2))
                                                                           for _ in range(20)]:
        assert np.array_equal(rec.features[lo:hi], flat[lo:hi]), (lo, hi)
    data = RecordedData(small.target, str(whole))
    assert data.stats()["data"]["answer_tokens"] == summary(whole)["answer_tokens"]
    assert data.stats()["data"]["prompt_files"] == ["p.jsonl"]
    ids = data.windows(3, 9, seed=1).next()
    assert ids.shape == (3, 9)


def test_the_topk_teacher_is_the_targets_renormalised_topk_on_answers_and_its_lm_head_on_prompts(small, whole):
    """`RecordedTarget(teacher="topk")` answering each recorded conversation, against the target run on it: on rows
    where the target was asked for a next token (an answer's, and a prompt's last), the softmax of its logits is the
    target's top-k renormalised; on the other prompt rows, the target's own logits ("full": on every row)."""
    from specdec.zoo.train.record import RecordedTarget
    rec = load_recordings([shard_dir(whole, 0), shard_dir(whole, 1)])
    teacher = RecordedTarget(small.target, rec.layers, teacher="topk")
    full = RecordedTarget(small.target, rec.layers, teacher="full")
    for tokens, feats, ids, probs in conversations(whole):
        x = torch.from_numpy(tokens.astype(np.int64))[None]
        pos = torch.arange(x.shape[1])[None]
        teacher.current = full.current = (x, torch.from_numpy(np.array(feats))[None],
                                          (torch.from_numpy(ids)[None], torch.from_numpy(probs)[None]))
        recorded = torch.from_numpy(ids[:, 0] >= 0)
        assert recorded.any() and not recorded.all()
        with torch.no_grad():
            got, want = teacher(x, pos).logits[0], small.target(x, pos).logits[0].float()
            torch.testing.assert_close(full(x, pos).logits[0], want, atol=2e-2, rtol=1e-3)
        p = torch.softmax(want, dim=-1)
        top, where = p.topk(TOPK, dim=-1)
        want_topk = torch.zeros_like(p).scatter_(-1, where, top / top.sum(-1, keepdim=True))
        torch.testing.assert_close(torch.softmax(got[recorded], -1), want_topk[recorded], atol=2e-3, rtol=0)
        torch.testing.assert_close(got[~recorded], want[~recorded], atol=2e-2, rtol=1e-3)
    with pytest.raises(ValueError, match="teacher must be one of"):
        RecordedTarget(small.target, rec.layers, teacher="kl")
