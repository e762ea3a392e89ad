"""The zoo's draft LM (the `draft_lm` kind, SGLang's STANDALONE draft): the shipped one loads as a standalone Llama
of the byte vocabulary and decodes losslessly with the target, its stage trains and stores one, and its held-out
depth rows score the target's greedy path."""
import math

import pytest
import torch

from specdec import Engine, SamplingParams, SpecConfig
from specdec.draft_kinds import draft_kind
from specdec.models import LlamaConfig, LlamaForCausalLM, random_llama
from specdec.zoo import corpus
from specdec.zoo import train as zt


def _tiny_target():
    cfg = LlamaConfig(vocab_size=258, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    target = LlamaForCausalLM(cfg)
    zt.init_weights_(target, 2, 0)
    return target.eval()


def test_the_stage_trains_stores_and_loads_a_draft_lm(tmp_path):
    target = _tiny_target()
    shape = {"num_layers": 1, "hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 1,
             "num_key_value_heads": 1}
    opts = zt.StageOpts(steps=3, batch_size=2, seq_len=32, warmup=1, extra=dict(shape, cost_prompts=0))
    lm, stats = zt.train_draft_lm(target, opts, seed=0, log=lambda s: None)
    assert stats["steps"] == 3 and math.isfinite(stats["final_train_loss_ema"]) and "step_cost" not in stats
    assert all(p.grad is not None for p in lm.parameters())
    assert all(p.grad is None for p in target.parameters())  # the target stays frozen
    assert (lm.config.num_hidden_layers, lm.config.hidden_size, lm.config.vocab_size) == (1, 16, 258)
    zt.save_stored(lm, tmp_path / "draft_lm", draft=True)
    loaded = draft_kind("draft_lm").load(tmp_path / "draft_lm", target)
    assert isinstance(loaded, LlamaForCausalLM) and loaded.dtype == torch.float32
    for (name, p), q in zip(lm.named_parameters(), loaded.parameters()):  # int8 per row: within half a step
        assert (p - q).abs().max() <= p.abs().max() / 127, name
    prompts = corpus.heldout_prompts(1, 48, seed=1)
    params = SamplingParams(max_new_tokens=8, return_logprob=True)
    base = Engine(target, impl="reference").generate(prompts, params)
    outs = Engine(target, draft=loaded, spec=SpecConfig(2, 2, 4), impl="reference").generate(prompts, params)
    assert outs[0].token_ids == base[0].token_ids
    r = zt.evaluate_draft_lm(target, loaded, torch.from_numpy(corpus.heldout_windows(2, 40, seed=0)), depths=2,
                             seq_len=32)
    # (an untrained target's greedy bytes are rarely the text's, so depth 2 may count no position for ce_true)
    assert list(r) == ["depth1", "depth2"] and math.isfinite(r["depth1"]["ce_true_nats"])
    assert all(math.isfinite(d["ce_target_nats"]) and 0 <= d["top1_agreement"] <= 1 for d in r.values())


def test_the_depth_rows_score_the_target_s_greedy_path():
    """Depth d anchored at t: both models read x_0..x_t and the target's d-1 greedy tokens after it. The unrolled
    passes give what running each path on its own gives."""
    torch.manual_seed(0)
    target = random_llama(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, seed=1)
    lm = random_llama(vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, seed=2)
    N, T, depths = 3, 9, 3
    windows = torch.randint(0, 40, (N, T + 1))
    windows[0, :4] = 7  # some positions on the held-out text at depth >= 2 (the ce_true rows count those)
    got = zt.evaluate_draft_lm(target, lm, windows, depths=depths, chunk=2)

    def logits_at_end(model, seq):
        return model(seq[None], torch.arange(len(seq))[None]).logits[0, -1]

    sums = {d: [0.0, 0, 0.0, 0.0, 0] for d in range(1, depths + 1)}
    with torch.no_grad():
        for w in windows:
            for t in range(T):
                path = w[:t + 1]
                for d in range(1, depths + 1):
                    if d > 1:
                        path = torch.cat([path, logits_at_end(target, path).argmax()[None]])
                    if t + d - 1 >= T:
                        break
                    z, q = logits_at_end(target, path), logits_at_end(lm, path)
                    lp = torch.log_softmax(q, -1)
                    s = sums[d]
                    if torch.equal(path, w[:len(path)]):
                        s[0] += float(-lp[w[len(path)]])
                        s[1] += 1
                    s[2] += float(-(torch.softmax(z, -1) * lp).sum())
                    s[3] += float(q.argmax() == z.argmax())
                    s[4] += 1
    for d, s in sums.items():
        want = {"ce_true_nats": s[0] / s[1], "ce_target_nats": s[2] / s[4], "top1_agreement": s[3] / s[4]}
        for key, value in want.items():
            assert got[f"depth{d}"][key] == pytest.approx(value, abs=2e-4), (d, key)

