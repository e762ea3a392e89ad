"""The zoo's draft LM (the `draft_lm` kind, SGLang's STANDALONE draft): the shipped one loads as a standalone Llama
of the byte vocabulary and decodes losslessly with the target, its stage trains and stores one, and its held-out
depth rows score the target's greedy path."""
import math

import pytest
import torch
from safetensors.torch import load_file

from specdec import Engine, SamplingParams, SpecConfig, zoo
from specdec.draft_kinds import draft_kind, kind_of
from specdec.models import LlamaConfig, LlamaForCausalLM, random_llama
from specdec.zoo import corpus
from specdec.zoo import train as zt
from tests.helpers import LOGPROB_ATOL

SPECS = {"chain S3": SpecConfig(3, 1), "tree S5 K4 W16": SpecConfig(5, 4, 16)}


@pytest.fixture(scope="module")
def bundle():
    return zoo.load("stdlib-byte-6l")


@pytest.fixture(scope="module")
def greedy_baseline(bundle):
    prompts = corpus.heldout_prompts(3, 64, seed=5)
    params = SamplingParams(max_new_tokens=24, return_logprob=True)
    return prompts, params, Engine(bundle.target, impl="reference").generate(prompts, params)


@pytest.mark.parametrize("name", zoo.names())
def test_each_pair_ships_a_standalone_draft_lm(name):
    b = zoo.load(name)
    lm, tc = b.draft_lm, b.target.config
    assert isinstance(lm, LlamaForCausalLM) and kind_of(lm).name == "draft_lm"
    assert lm.config.vocab_size == tc.vocab_size == b.tokenizer.vocab_size
    assert lm.dtype == torch.float32 and not lm.training
    assert lm.config.num_hidden_layers in (1, 2) and lm.config.hidden_size < tc.hidden_size
    # its own weights: nothing is the target's tensor
    target_ptrs = {p.data_ptr() for p in b.target.parameters()}
    assert not any(p.data_ptr() in target_ptrs for p in lm.parameters())
    sd = load_file(str(b.path / "draft_lm" / "model.safetensors"))
    assert sd["model.embed_tokens.weight"].dtype == torch.int8 and sd["model.norm.weight"].dtype == torch.float16
    heldout, trained = b.card["heldout"]["draft_lm"], b.card["training"]["draft_lm"]
    assert list(heldout) == [f"depth{d}" for d in range(1, 6)] and heldout["depth1"]["top1_agreement"] > 0.5
    assert trained["command"].startswith("specdec zoo train") and "--stage draft_lm" in trained["command"]
    cost = trained["step_cost"]
    assert cost["threads"] == 1 and cost["draft_forward_in_target_only_steps"] == pytest.approx(
        cost["draft_forward_ms"] / cost["target_only_step_ms"], rel=1e-2)


@pytest.mark.parametrize("shape", SPECS)
def test_the_shipped_draft_lm_is_greedy_lossless_and_accepts(bundle, greedy_baseline, shape):
    prompts, params, base = greedy_baseline
    outs = Engine(bundle.target, draft=bundle.draft_lm, spec=SPECS[shape], impl="reference").generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in base]
    assert max(abs(x - y) for o, b in zip(outs, base) for x, y in zip(o.logprobs, b.logprobs)) <= LOGPROB_ATOL
    assert sum(a for o in outs for a in o.accept_lens) > 1.3 * sum(len(o.accept_lens) for o in outs)


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
    opts = zt.StageOpts(steps=3, batch_size=2, seq_len=32, warmup=1, extra=shape)
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


def test_the_card_renders_the_draft_lm_only_where_a_pair_has_one():
    card = zt.read_card(zoo.WEIGHTS_DIR, zoo.SMALL_NAME)
    md = zt.render_model_card(card)
    assert "| `draft_lm` | STANDALONE draft LM" in md and "| `draft_lm` | depth5 |" in md
    assert card["training"]["draft_lm"]["command"] in md and "The draft LM reads bytes only" in md
    without = dict(card, heldout={k: v for k, v in card["heldout"].items() if k != "draft_lm"},
                   models={k: v for k, v in card["models"].items() if k != "draft_lm"},
                   training={k: v for k, v in card["training"].items() if k != "draft_lm"})
    assert "draft_lm" not in zt.render_model_card(without) and "draft LM" not in zt.render_model_card(without)
