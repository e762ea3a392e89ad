"""The DSpark trainer stage: the dense training path shows each block what inference shows it (the float64 oracle,
teacher-forced: each position's Markov bias and confidence read the data's token before it, an rnn head's state runs
through each block from zero), the loss is DeepSpec's and the held-out rows are the evaluation's (both recomputed here
from the oracle's blocks), and the loss on held-out windows falls within a few dozen steps on the small pair's
target."""
import pytest
import torch
from safetensors.torch import load_file

from specdec import zoo
from specdec.models import random_llama
from specdec.models.dspark import random_dspark
from specdec.zoo.train import StageOpts
from specdec.zoo.train.block_stages import DSPARK_LOSS_WEIGHTS, dflash_blocks, dspark_loss, train_dspark
from specdec.zoo.train.evaluate import evaluate_dspark
from tests.helpers.oracles import dspark_block_from_tensors

MASK = 63


@pytest.mark.parametrize("markov", ["gated", "rnn"])
def test_the_training_path_is_the_oracle_teacher_forced(markov):
    """Three blocks in one window: block m at anchor p sees the context x_0..x_{p-1} and itself; position j's logits
    are refined by x_{p+j} (an rnn head's state running from zero over x_p..x_{p+j}) and its confidence reads
    x_{p+j}, as the oracle computes with the data's tokens as the proposals."""
    target = random_llama(vocab_size=64, hidden_size=32, num_hidden_layers=4, seed=7, model_type="qwen3")
    model = random_dspark(target, 2, 4, target_layer_ids=[-1, 1], mask_token_id=MASK, seed=2, markov_rank=8,
                          markov_head_type=markov)
    cfg, sd = model.checkpoint()
    tokens = [5, 9, 2, 44, 17, 3, 30, 8, 12, 40, 1, 7, 22]
    T, bs = len(tokens), 4
    batch = torch.tensor([tokens])
    with torch.no_grad():
        feats = target(batch, torch.arange(T)[None], features=model.feature_layers).features
        anchors = torch.tensor([[1, 4, 8]])
        positions, mask = dflash_blocks(T, anchors, bs)
        before = batch.gather(1, positions)
        ids = before.clone()
        ids.view(1, 3, bs)[:, :, 1:] = MASK
        hidden = model.forward_dense(feats, torch.arange(T)[None], ids, positions, mask)
        logits = model.refine_logits(model.compute_logits(hidden).view(1, 3, bs, -1), before.view(1, 3, bs),
                                     hidden.view(1, 3, bs, -1))[0]
        confidence = model.confidence_logits(hidden, before)[0]
    for m, p in enumerate(anchors[0].tolist()):
        _, want, want_conf, _ = dspark_block_from_tensors(sd, cfg, feats[0, :p], tokens[p], bs,
                                                          proposals=tokens[p + 1:p + 1 + bs])
        assert (logits[m].double() - want).abs().max() < 1e-4
        assert (confidence[m * bs:(m + 1) * bs].double() - want_conf).abs().max() < 1e-4


@pytest.mark.parametrize("markov", ["vanilla", "rnn"])
def test_the_loss_is_deepspecs_three_terms(markov):
    """Two blocks per window at known anchors (the generator's draws, replayed), each block's logits and confidence
    from the float64 oracle over its own prefix: the cross-entropy on the data's next tokens, the total variation
    against the target's distribution and the confidence head's binary cross-entropy against 1 - TV / 2, each a
    decay-weighted mean over block positions."""
    target = random_llama(vocab_size=64, hidden_size=32, num_hidden_layers=4, seed=7, model_type="qwen3")
    model = random_dspark(target, 1, 3, target_layer_ids=[0], mask_token_id=MASK, seed=3, markov_rank=4,
                          markov_head_type=markov)
    cfg, sd = model.checkpoint()
    batch = torch.randint(0, 60, (2, 12), generator=torch.Generator().manual_seed(1))
    gamma, blocks = 2.0, 2
    with torch.no_grad():
        loss, parts = dspark_loss(target, model, batch, blocks, gamma, DSPARK_LOSS_WEIGHTS, False,
                                  torch.Generator().manual_seed(9))
        g = torch.Generator().manual_seed(9)
        anchors = [(torch.randperm(12 - 3 - 1, generator=g)[:blocks] + 1).tolist() for _ in range(2)]
        z = target(batch, torch.arange(12)[None].expand(2, 12)).logits.double()
        feats = target(batch, torch.arange(12)[None].expand(2, 12), features=model.feature_layers).features
    w = torch.exp(-torch.arange(3.0, dtype=torch.float64) / gamma)
    terms = torch.zeros(3, 3, dtype=torch.float64)  # (term, position)
    count = 2 * blocks
    for b, row in enumerate(anchors):
        for p in row:
            tokens = batch[b].tolist()
            _, logits, confidence, _ = dspark_block_from_tensors(sd, cfg, feats[b, :p], tokens[p], 3,
                                                                 proposals=tokens[p + 1:p + 4])
            q = torch.softmax(logits, -1)
            pt = torch.softmax(z[b, p:p + 3], -1)
            tv = (q - pt).abs().sum(-1)
            terms[0] += -torch.log(q[torch.arange(3), batch[b, p + 1:p + 4]]) / count
            terms[1] += tv / count
            accept = 1 - tv / 2
            terms[2] += (torch.logaddexp(torch.zeros(3, dtype=torch.float64), -confidence)
                         + (1 - accept) * confidence) / count  # BCE with logits, written out
    want = (terms * w).sum(1) / w.sum()
    for k, name in enumerate(("ce", "l1", "confidence")):
        assert abs(parts[name] - float(want[k])) < 1e-5, name
    assert abs(float(loss) - sum(DSPARK_LOSS_WEIGHTS[n] * float(want[k])
                                 for k, n in enumerate(("ce", "l1", "confidence")))) < 1e-5


@pytest.mark.parametrize("markov", ["vanilla", "rnn"])
def test_the_held_out_rows_are_the_oracles_per_block_position(markov):
    """`evaluate_dspark` on two windows, blocks anchored every 4 tokens: each position's cross-entropies, agreement,
    accepted prefix and mean confidence are the float64 oracle's, block by block over its own prefix."""
    target = random_llama(vocab_size=64, hidden_size=32, num_hidden_layers=4, seed=7, model_type="qwen3")
    model = random_dspark(target, 1, 3, target_layer_ids=[0], mask_token_id=MASK, seed=3, markov_rank=4,
                          markov_head_type=markov, std=0.5)
    cfg, sd = model.checkpoint()
    windows = torch.randint(0, 60, (2, 12), generator=torch.Generator().manual_seed(2))
    rows = evaluate_dspark(target, model, windows, stride=4)
    sums, count = torch.zeros(5, 3, dtype=torch.float64), 0
    with torch.no_grad():
        z = target(windows, torch.arange(12)[None].expand(2, 12)).logits.double()
        feats = target(windows, torch.arange(12)[None].expand(2, 12), features=model.feature_layers).features
    for b in range(2):
        tokens = windows[b].tolist()
        for p in range(1, 12 - 3, 4):
            _, logits, confidence, _ = dspark_block_from_tensors(sd, cfg, feats[b, :p], tokens[p], 3,
                                                                 proposals=tokens[p + 1:p + 4])
            lq = torch.log_softmax(logits, -1)
            agree = (logits.argmax(-1) == z[b, p:p + 3].argmax(-1)).double()
            sums += torch.stack([-lq[torch.arange(3), windows[b, p + 1:p + 4]],
                                 -(torch.softmax(z[b, p:p + 3], -1) * lq).sum(-1), agree, agree.cumprod(0),
                                 torch.sigmoid(confidence)])
            count += 1
    want = sums / count
    for j in range(3):
        got = rows[f"pos{j + 1}"]
        for k, name in enumerate(("ce_true_nats", "ce_target_nats", "top1_agreement", "accept_prefix", "confidence")):
            assert abs(got[name] - float(want[k, j])) < 1e-4, (name, j)


@pytest.mark.slow
def test_the_stage_trains_on_the_small_pair():
    """30 steps of a small drafter: the held-out loss (a fixed batch and anchors) falls by more than 5% against the
    same seed's drafter after one step, and every term with it."""
    target = zoo.load(zoo.SMALL_NAME).target
    held = torch.from_numpy(zoo.corpus.heldout_windows(4, 48, seed=3).astype("int64"))
    extra = {"num_layers": 1, "block_size": 4, "blocks_per_window": 8, "markov_rank": 16, "norm_from_target": True}

    def trained(steps):
        opts = StageOpts(steps=steps, batch_size=2, seq_len=48, warmup=2, lr=3e-3, amp=False, extra=extra)
        model, _ = train_dspark(target, opts, seed=0, log=lambda *a: None)
        with torch.no_grad():
            return dspark_loss(target, model, held, 8, 4.0, DSPARK_LOSS_WEIGHTS, False,
                               torch.Generator().manual_seed(5))

    (first, first_parts), (last, last_parts) = trained(1), trained(30)
    assert float(last) < 0.95 * float(first), (first_parts, last_parts)
    assert all(last_parts[k] < first_parts[k] for k in ("ce", "l1", "confidence")), (first_parts, last_parts)


def test_the_named_stage_trains_into_a_pair_and_its_card(tmp_path):
    """`specdec zoo train --stage dspark` after a tiny target: the drafter is stored beside it (int8 matrices, as
    every zoo draft), loads as its kind, decodes as the target alone, and the card has its training and held-out
    rows (by block position, with the confidence head's mean estimate). A whole run leaves the stage out."""
    from specdec import Engine, SamplingParams
    from specdec.draft_kinds import draft_kind
    from specdec.zoo import train as zt
    common = ["--out", str(tmp_path), "--name", "tiny", "--layers", "2", "--hidden", "32", "--intermediate", "64",
              "--heads", "2", "--kv-heads", "1", "--seq-len", "32", "--batch-size", "2", "--threads",
              str(torch.get_num_threads()), "--eval-windows", "2", "--eval-len", "32", "--cost-prompts", "0"]
    assert "dspark" not in zt.STAGES and "dspark" in zt.EXTRA_STAGES
    assert zt.main(common + ["--stage", "target", "--target-steps", "2"]) == 0
    assert zt.main(common + ["--stage", "dspark", "--dspark-steps", "2"]) == 0
    b = zoo.load_dir(tmp_path / "tiny", "tiny")
    assert b.dspark is b.drafts["dspark"] and draft_kind("dspark").claims(b.dspark) and b.dspark.block_size == 7
    assert b.card["training"]["dspark"]["steps"] == 2 and set(b.card["heldout"]["dspark"]) == {
        f"pos{j}" for j in range(1, 8)} and "confidence" in b.card["heldout"]["dspark"]["pos1"]
    prompt, params = [[10, 20, 30, 40]], SamplingParams(max_new_tokens=8)
    want = Engine(b.target, max_seq_len=32).generate(prompt, params)[0].token_ids
    assert Engine(b.target, b.dspark, draft_kind("dspark").default_spec(b.dspark),
                  max_seq_len=32).generate(prompt, params)[0].token_ids == want


@pytest.mark.slow
def test_a_drafter_for_a_given_target_trains_on_its_recording(tmp_path):
    """`specdec zoo train-draft --kind dspark`'s path on a tiny recording of the small pair's target (its streams
    entering layers 1 and 3, what the drafter reads, and the last layer's output, the teacher's logits): stored in
    DeepSpec's layout in float16 with the target's fingerprint, loaded for that target, decoding as the target
    alone."""
    import json

    import numpy as np

    from specdec import Engine, SamplingParams
    from specdec.draft_kinds import draft_kind
    from specdec.zoo.train.for_target import target_draft_opts, train_target_draft, unused_token_id
    from specdec.zoo.train.record import RecordedData, record_responses
    small = zoo.load(zoo.SMALL_NAME)
    tok, target = small.tokenizer, small.target
    prompts = [tok.encode(t) for t in ("def parse(self, text):\n", "import os\nimport sys\n\n")]
    toks, feats, starts = record_responses(target, prompts, (1, 3, 6), 40, [0.0, 0.0], batch_size=2,
                                           log=lambda s: None)
    rec = tmp_path / "rec"
    rec.mkdir()
    for name, array in (("tokens", toks), ("features", feats), ("starts", starts)):
        np.save(rec / f"{name}.npy", array)
    (rec / "meta.json").write_text(json.dumps({
        "target": zoo.target_fingerprint(target), "layers": [1, 3, 6], "split": "train", "conversations": 2,
        "max_new_tokens": 40, "sampled_every": 0, "temperature": 0.0, "cpu_seconds": 0.0}))
    data = RecordedData(target, str(rec))
    opts = target_draft_opts(target, unused_token_id(tok, data.stream))["dspark"]
    opts.steps, opts.warmup, opts.batch_size, opts.seq_len = 2, 1, 2, 24
    opts.extra["target_layer_ids"] = [0, 2]
    row = train_target_draft(target, "dspark", data, opts, tmp_path / "out", None, log=lambda s: None)
    assert row["training"]["data"]["conversations"] == 2
    saved = json.loads((tmp_path / "out" / "dspark" / "config.json").read_text())
    assert saved["architectures"] == ["Qwen3DSparkModel"] and saved["block_size"] == 7
    assert saved["specdec_target_fingerprint"] == zoo.target_fingerprint(target)
    stored = load_file(str(tmp_path / "out" / "dspark" / "model.safetensors"))
    assert "embed_tokens.weight" not in stored and "lm_head.weight" not in stored and "fc.weight" in stored
    draft = zoo.load_draft_for("dspark", tmp_path / "out" / "dspark", target)
    params = SamplingParams(max_new_tokens=12)
    want = Engine(target, max_seq_len=64).generate([prompts[0]], params)[0].token_ids
    assert Engine(target, draft, draft_kind("dspark").default_spec(draft), max_seq_len=64).generate(
        [prompts[0]], params)[0].token_ids == want
