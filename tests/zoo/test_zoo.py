"""The model zoo: tokenizer, corpus split, shipped checkpoints, and the trainer on tiny configs."""
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from specdec import zoo
from specdec.models import LlamaConfig, LlamaForCausalLM, random_eagle3_head, random_eagle_head, random_llama
from specdec.zoo import corpus
from specdec.zoo import train as zt
from specdec.tokenizer import ByteTokenizer, Tokenizer


# ---- tokenizer --------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["def f(x):\n    return x + 1\n", "", "naïve café — Ωμέγα 日本語 🐍\t\r\n"])
def test_tokenizer_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert all(0 <= i < 256 for i in ids)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, add_special_tokens=True) + [tok.eos_token_id]) == text
    assert tok.decode(torch.tensor(ids, dtype=torch.long)) == text


def test_tokenizer_specials_and_bad_bytes():
    tok = ByteTokenizer()
    assert tok.vocab_size == 258 and tok.bos_token_id == 256 and tok.eos_token_id == 257
    assert isinstance(tok, Tokenizer)  # the protocol the engine, the text helpers and the grammar backend read
    assert tok.encode("a", add_special_tokens=True) == [256, 97] and tok.eos_token_ids == [257]
    assert tok.decode([0xE6, 0x97]) == "\ufffd"  # a multi-byte character cut short: replaced, no error
    with pytest.raises(ValueError, match="outside"):
        tok.decode([300])
    with pytest.raises(TypeError):
        tok.encode(b"bytes")


# ---- corpus -----------------------------------------------------------------------------------
def test_corpus_split_is_deterministic_and_disjoint_by_file():
    train, held = corpus.files("train"), corpus.files("heldout")
    tn, hn = [r for r, _ in train], [r for r, _ in held]
    assert tn == sorted(tn) and hn == sorted(hn)
    assert not set(tn) & set(hn)
    assert sorted(tn + hn) == [r for r, _ in corpus.files("all")]
    assert all(corpus.is_heldout(r) for r in hn) and not any(corpus.is_heldout(r) for r in tn)
    assert 0.02 < len(hn) / (len(tn) + len(hn)) < 0.10
    assert not any(r.split("/")[0] in ("test", "site-packages") or "/tests/" in r for r in tn + hn)
    # the split depends on the path only (a stable hash), not on the order or the machine
    assert corpus.is_heldout("ast.py") == corpus.is_heldout("ast.py")
    s = corpus.token_stream("heldout")
    assert s.dtype == np.uint16 and len(s) == sum(len(d) for _, d in held) + len(held)
    assert int((s == ByteTokenizer.eos_token_id).sum()) == len(held)


def test_heldout_prompts_are_reproducible_and_come_from_heldout_files():
    p1 = corpus.heldout_prompts(5, 96, seed=3)
    assert p1 == corpus.heldout_prompts(5, 96, seed=3)
    assert p1 != corpus.heldout_prompts(5, 96, seed=4)
    held = [d for _, d in corpus.files("heldout")]
    for p in p1:
        assert 48 <= len(p) <= 96 and p[-1] == ord("\n")
        b = bytes(p)
        assert any(b in d and (d.startswith(b) or b"\n" + b in d) for d in held)


# ---- shipped checkpoints ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bundle():
    if zoo.SMALL_NAME not in zoo.names():
        pytest.fail(f"shipped checkpoint {zoo.SMALL_NAME!r} missing; names() = {zoo.names()}")
    return zoo.load("stdlib-byte-6l")


def test_unknown_name_is_a_value_error():
    with pytest.raises(ValueError, match="available"):
        zoo.load("no-such-model")


def test_load_gives_fp32_models_and_a_card(bundle):
    assert bundle.name == zoo.SMALL_NAME
    for m in (bundle.target, bundle.eagle, bundle.eagle3, bundle.mtp, bundle.mtp_chain):
        assert m is not None and m.dtype == torch.float32 and not m.training
    assert bundle.mtp.num_layers == 3 and not bundle.mtp.chain_hidden_states
    assert bundle.mtp_chain.num_layers == 3 and bundle.mtp_chain.chain_hidden_states
    assert bundle.target.config.vocab_size == bundle.tokenizer.vocab_size
    card = bundle.card
    for key in ("corpus", "training", "heldout", "models", "command", "seed", "total_train_seconds"):
        assert key in card
    for stage in ("target", "eagle", "eagle3", "mtp", "mtp_chain"):
        assert card["training"][stage]["train_seconds"] > 0
    assert card["total_bytes_on_disk"] <= 20e6  # the budget of what ships
    on_disk = sum(f.stat().st_size for f in bundle.path.rglob("*") if f.is_file())
    assert on_disk <= 20e6


def test_the_shipped_eagle3_head_is_the_card_s(bundle):
    """Its draft vocabulary is the most frequent ids of the train stream, its features the card's layers."""
    e3, tr = bundle.eagle3, bundle.card["training"]["eagle3"]
    vocab = zt.draft_vocabulary(corpus.token_stream("train"), 258, tr["draft_vocab_size"])
    assert torch.equal(e3.draft_to_target(torch.arange(len(vocab))), vocab)
    assert torch.equal(torch.nonzero(e3.t2d).flatten(), vocab)
    assert list(e3.feature_layers) == tr["feature_layers"] == zt.zoo_feature_layers(6)
    sd = load_file(str(bundle.path / "eagle3" / "model.safetensors"))
    assert sd["fc.weight"].dtype == torch.int8 and sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool


def test_shipped_models_are_trained(bundle):
    win = torch.from_numpy(corpus.heldout_windows(4, 259, seed=7))
    t = zt.evaluate_target(bundle.target, win[:, :257])
    assert t["heldout_nats_per_byte"] < 2.0  # a uniform byte guess is log(258) = 5.55
    for head in (bundle.eagle, bundle.eagle3):
        e = zt.evaluate_eagle(bundle.target, head, win[:, :257], depths=2)
        assert e["depth1"]["top1_agreement"] > 0.5 and e["depth2"]["top1_agreement"] > 0.3  # chance ~ 1/258
    for key in ("mtp", "mtp_chain"):
        r = zt.evaluate_mtp(bundle.target, getattr(bundle, key), win)
        assert r["layer1"]["top1_agreement"] > 0.5 and r["layer3"]["top1_agreement"] > 0.2


def test_shipped_target_continues_python(bundle):
    tok = bundle.tokenizer

    def greedy(text, n):
        ids = torch.tensor([tok.encode(text)])
        with torch.no_grad():
            for _ in range(n):
                logits = bundle.target(ids, torch.arange(ids.shape[1])[None]).logits
                ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
        return tok.decode(ids[0, -n:].tolist())

    assert greedy("def f(x):\n", 4) == "    "  # a function body is indented
    out = greedy("class Foo:\n    def __init__(self, x):\n        self.", 40)
    assert out.isascii() and "\n        " in out


# ---- the trainer, on tiny configs ---------------------------------------------------------------
def _tiny_target():
    cfg = LlamaConfig(vocab_size=258, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    return cfg


def test_train_target_smoke():
    opts = zt.StageOpts(steps=6, batch_size=2, seq_len=64, warmup=2, lr=3e-3)
    model, stats = zt.train_target(_tiny_target(), opts, seed=0, log=lambda s: None)
    assert stats["steps"] == 6 and math.isfinite(stats["final_train_loss_ema"])
    assert stats["tokens_seen"] == 6 * 2 * 64
    r = zt.evaluate_target(model, torch.from_numpy(corpus.heldout_windows(2, 65, seed=0)))
    assert math.isfinite(r["heldout_nats_per_byte"]) and r["heldout_nats_per_byte"] < math.log(258) + 0.5


def test_train_is_seeded():
    opts = zt.StageOpts(steps=2, batch_size=2, seq_len=32, warmup=1, amp=False)
    a, _ = zt.train_target(_tiny_target(), opts, seed=5, log=lambda s: None)
    b, _ = zt.train_target(_tiny_target(), opts, seed=5, log=lambda s: None)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n


def test_train_drafts_smoke():
    from specdec.models import LlamaForCausalLM

    target = LlamaForCausalLM(_tiny_target())
    zt.init_weights_(target, 2, 0)
    opts = zt.StageOpts(steps=2, batch_size=2, seq_len=32, warmup=1, extra={"unroll": 2})
    head, st = zt.train_eagle(target, opts, seed=0, log=lambda s: None)
    assert st["unroll"] == 2 and all(p.grad is not None for p in head.parameters())
    assert all(p.grad is None for p in target.parameters())  # the target stays frozen
    opts = zt.StageOpts(steps=2, batch_size=2, seq_len=32, warmup=1,
                        extra={"unroll": 2, "draft_vocab_size": 50, "fc_norm": True, "norm_output": True})
    head3, st = zt.train_eagle3(target, opts, seed=0, log=lambda s: None)
    assert st["feature_layers"] == [1, 2] and st["draft_vocab_size"] == 50
    assert 0.9 < st["draft_vocab_train_coverage"] <= 1
    assert head3.config.fc_norm and head3.config.norm_output and not head3.config.norm_before_fc
    assert all(p.grad is not None for p in head3.parameters())
    assert all(p.grad is None for p in target.parameters())
    for chain in (False, True):
        opts = zt.StageOpts(steps=2, batch_size=2, seq_len=32, warmup=1, extra={"num_layers": 3})
        m, _ = zt.train_mtp(target, opts, chain_hidden_states=chain, seed=0, log=lambda s: None)
        assert m.num_layers == 3 and m.chain_hidden_states == chain


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_unrolled_passes_train_through_the_cache(kind):
    """The trainer runs the head's `step` (the forward's cached path builds no graph): the last unrolled pass's
    loss alone reaches every weight of the head and the hidden states pass 0 read, through the keys and values
    earlier passes left in the cache."""
    torch.manual_seed(0)
    tgt = random_llama(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2)
    head = (random_eagle_head(tgt, seed=3) if kind == "eagle" else
            random_eagle3_head(tgt, draft_vocab_size=24, feature_layers=[1, 2, 3], seed=3, fc_norm=True))
    head.train()
    B, T = 2, 8
    x = torch.randint(0, 40, (B, T + 1))
    with torch.no_grad():
        out = tgt(x[:, :-1], torch.arange(T)[None].expand(B, T), features=getattr(head, "feature_layers", None))
    h = (out.hidden if kind == "eagle" else out.features).clone().requires_grad_(True)
    logits, _ = zt.eagle_unrolled(head, h, x[:, 1:], 3)[-1]
    logits[:, 2:].logsumexp(-1).sum().backward()
    assert h.grad is not None and h.grad[:, :T - 2].abs().sum(-1).min() > 0
    for name, p in head.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_ttt_unrolling_matches_step_by_step_drafting(kind):
    """Pass j at position t of the unrolled training forward = draft step j anchored at t - j: the head
    run over the real hidden states up to t - j, then fed its own output hidden state j times. An EAGLE-3
    head (every optional norm on) projects the target's features at pass 0 and reads its own output after."""
    torch.manual_seed(0)
    tgt = random_llama(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2)
    if kind == "eagle":
        head = random_eagle_head(tgt, seed=3)
    else:
        head = random_eagle3_head(tgt, draft_vocab_size=24, feature_layers=[1, 2, 3], seed=3, norm_before_fc=True,
                                  fc_norm=True, norm_output=True)
    B, T = 2, 10
    x = torch.randint(0, 40, (B, T + 1))
    pos = lambda n: torch.arange(n)[None].expand(B, n)  # noqa: E731
    with torch.no_grad():
        out = tgt(x[:, :-1], pos(T), features=getattr(head, "feature_layers", None))
        h = out.hidden if kind == "eagle" else out.features
        outs = zt.eagle_unrolled(head, h, x[:, 1:], 4)
        for a in range(T):
            hid = h[:, :a + 1] if kind == "eagle" else head.project_features(h[:, :a + 1])
            lg, g, _ = head(x[:, 1:a + 2], hid, pos(a + 1))
            torch.testing.assert_close(lg[:, a], outs[0][0][:, a], atol=1e-4, rtol=1e-4)
            for j in range(1, 4):
                t = a + j
                if t >= T:
                    break
                hid = torch.cat([hid, g[:, -1:]], dim=1)
                lg, g, _ = head(x[:, 1:t + 2], hid, pos(t + 1))
                torch.testing.assert_close(lg[:, t], outs[j][0][:, t], atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(g[:, t], outs[j][1][:, t], atol=1e-4, rtol=1e-4)


def test_draft_vocabulary_is_the_most_frequent_ids_ascending():
    stream = np.array([5, 5, 5, 2, 2, 9, 9, 7, 0], dtype=np.uint16)
    assert zt.draft_vocabulary(stream, 12, 3).tolist() == [2, 5, 9]  # 5 thrice, 2 and 9 twice
    assert zt.draft_vocabulary(stream, 12, 4).tolist() == [0, 2, 5, 9]  # 0 and 7 tie once: the lower id
    assert zt.draft_vocabulary(stream, 12, 12).tolist() == list(range(12))
    with pytest.raises(ValueError, match="draft vocabulary size"):
        zt.draft_vocabulary(stream, 12, 13)
    assert zt.zoo_feature_layers(6) == [2, 4, 6] and zt.zoo_feature_layers(2) == [1, 2]
    assert zt.zoo_feature_layers(24) == [2, 12, 21]  # a deep target: the peers' default, low, middle, high


def test_a_bad_eagle3_vocabulary_is_refused_before_any_training(capsys):
    with pytest.raises(SystemExit) as exit_:
        zt.main(["--eagle3-vocab", "300", "--out", "/nonexistent"])
    assert exit_.value.code == 2 and "--eagle3-vocab must be in [1, 258]" in capsys.readouterr().err


@pytest.mark.parametrize("Hq, Hkv", [(4, 2), (2, 2)])
def test_ttt_ops_attend_as_a_per_position_loop(Hq, Hkv):
    """The unrolled passes' attention (`TTT_OPS`), written against a loop over query positions: the pass-j
    query at t attends to pass 0's keys at s <= t - j, then to pass i's key at s = t - j + i for 1 <= i <= j
    where that position exists (the keys `ttt_mask` marks), one softmax over them; a KV head serves
    Hq // Hkv query heads in order."""
    g = torch.Generator().manual_seed(0)
    B, T, D, passes = 2, 7, 8, 4
    ks = [torch.randn(B, T, Hkv, D, generator=g) for _ in range(passes)]
    vs = [torch.randn(B, T, Hkv, D, generator=g) for _ in range(passes)]
    q = torch.randn(B, T, Hq, D, generator=g)
    for j in range(passes):
        kc, vc = zt.stages._PassKV(T), zt.stages._PassKV(T)
        kc.passes, vc.passes = ks[:j + 1], vs[:j + 1]
        got = zt.stages.TTT_OPS.tree_attention(q, kc, vc, None, None, 0, None, T, 0.3)
        mask = zt.ttt_mask(T, j)
        for b in range(B):
            for t in range(T):
                keys = [(0, s) for s in range(0, t - j + 1)] + [(i, t - j + i) for i in range(1, j + 1)
                                                                if t - j + i >= 0]
                assert sorted(i * T + s for i, s in keys) == torch.nonzero(mask[t]).flatten().tolist()
                for h in range(Hq):
                    kv = h // (Hq // Hkv)
                    k = torch.stack([ks[i][b, s, kv] for i, s in keys])
                    v = torch.stack([vs[i][b, s, kv] for i, s in keys])
                    w = torch.softmax(0.3 * (k @ q[b, t, h]), dim=0)
                    torch.testing.assert_close(got[b, t, h], w @ v, atol=1e-5, rtol=1e-5)


def tiny_eagle3_case():
    """A random 3-layer target, an EAGLE-3 head on all its layers, and a batch of 2 x 12 tokens (seeded)."""
    torch.manual_seed(0)
    tgt = random_llama(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2)
    return tgt, random_eagle3_head(tgt, feature_layers=[1, 2, 3], seed=3), torch.randint(0, 40, (2, 12))


def test_the_eagle3_pass_weights_are_the_paper_s_normalised():
    """Pass j's weight 0.8 ** j over their sum (decay 1: the mean); `eagle3_loss` is that weighted sum of the
    passes' cross-entropies it reports."""
    assert zt.pass_weights(3, 0.8) == pytest.approx([1 / 2.44, 0.8 / 2.44, 0.64 / 2.44])
    assert zt.pass_weights(4) == pytest.approx([0.25] * 4)
    with pytest.raises(ValueError):
        zt.pass_weights(0, 0.8)
    tgt, head, batch = tiny_eagle3_case()
    loss, parts = zt.eagle3_loss(tgt, head, batch, 3, False, 0.5)
    ce = [parts[f"ce{j}"] for j in (1, 2, 3)]
    assert float(loss.detach()) == pytest.approx((ce[0] + 0.5 * ce[1] + 0.25 * ce[2]) / 1.75, rel=1e-5)


def test_the_eagle3_regression_term_is_eagle_s_on_what_the_lm_heads_read():
    """w_reg adds, per pass, w_reg times the mean smooth-L1 distance between the head's normed output hidden and
    the target's final-normed hidden one position on, over the pass's positions, weighted as the pass's
    cross-entropy; recomputed here from the target's forward and the unrolled passes, one pass at a time."""
    tgt, head, batch = tiny_eagle3_case()
    plain, _ = zt.eagle3_loss(tgt, head, batch, 3, False, 0.5)
    with_reg, parts = zt.eagle3_loss(tgt, head, batch, 3, False, 0.5, w_reg=2.0)
    x = batch[:, :-1]
    T = x.shape[1]
    with torch.no_grad():
        out = tgt(x, torch.arange(T)[None].expand(*x.shape), features=head.feature_layers)
        outs = zt.eagle_unrolled(head, out.features, batch[:, 1:], 3)
    reg = 0.0
    for j, ((_, out_h), w) in enumerate(zip(outs, zt.pass_weights(3, 0.5))):
        with torch.no_grad():
            d = [torch.nn.functional.smooth_l1_loss(head.norm(out_h[b, t]), out.hidden[b, t + 1])
                 for b in range(2) for t in range(j, T - 1)]
        reg += w * 2.0 * float(torch.stack(d).mean())
    assert float((with_reg - plain).detach()) == pytest.approx(reg, rel=1e-4)
    assert reg > 0


def test_eagle3_feature_layers_outside_the_target_are_refused():
    cfg = LlamaConfig(vocab_size=258, hidden_size=16, intermediate_size=40, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=1)
    target = LlamaForCausalLM(cfg)
    opts = zt.StageOpts(steps=1, batch_size=1, seq_len=8, warmup=1, extra={"feature_layers": [1, 2, 4]})
    with pytest.raises(ValueError, match=r"feature_layers must be layer indices in \[0, 3\].*\[1, 2, 4\]"):
        zt.train_eagle3(target, opts, seed=0, log=lambda s: None)


def test_a_malformed_eagle3_layer_list_is_refused_before_any_training(capsys):
    with pytest.raises(SystemExit) as exit_:
        zt.main(["--eagle3-layers", "12,2", "--out", "/nonexistent"])
    assert exit_.value.code == 2 and "--eagle3-layers must be distinct ascending" in capsys.readouterr().err


def test_ttt_mask_shape_and_rows():
    m = zt.ttt_mask(6, 2)
    assert m.shape == (6, 18)
    assert m.sum(1).tolist() == [1, 2, 3, 4, 5, 6]  # real prefix s <= t-2, then one key per earlier pass
    assert zt.ttt_mask(4, 0).equal(torch.ones(4, 4).tril().bool())


def test_main_end_to_end_tiny(tmp_path):
    argv = ["--out", str(tmp_path), "--name", "tiny", "--target-steps", "2", "--eagle-steps", "1", "--mtp-steps",
            "1", "--mtp-chain-steps", "1", "--eagle3-steps", "1", "--eagle3-vocab", "200", "--draft-lm-steps", "1",
            "--dflash-steps", "1", "--cost-prompts", "1",
            "--layers", "2", "--hidden", "32", "--intermediate", "64",
            "--heads", "2", "--kv-heads", "1", "--seq-len", "32", "--batch-size", "2", "--threads",
            str(torch.get_num_threads()), "--eval-windows", "2", "--eval-len", "32",
            "--model-card", str(tmp_path / "card.md")]
    from specdec.bench.suites.draft_cost import record_trained_step_costs
    assert zt.main(argv, after_training=record_trained_step_costs) == 0
    b = zoo.load_dir(tmp_path / "tiny", "tiny")
    for kind in ("draft_lm", "dflash"):  # the card states their step cost, measured after training by the bench step
        cost = b.card["training"][kind]["step_cost"]
        assert cost["target_only_step_ms"] > 0 and cost["draft_forward_in_target_only_steps"] > 0, kind
    assert "step_cost" not in b.card["training"]["eagle"]
    assert b.card["command"].startswith("specdec zoo train --out")
    assert set(b.card["heldout"]) == {"target", "eagle", "eagle3", "mtp", "mtp_chain", "draft_lm", "dflash"}
    assert b.target.dtype == torch.float32 and b.eagle3.config.draft_vocab_size == 200
    sd = load_file(str(tmp_path / "tiny" / "target" / "model.safetensors"))
    assert all(v.dtype == torch.float16 for v in sd.values())
    for draft in zoo.zoo_kinds():  # matrices int8 with a scale per row, the rest fp16
        sd = load_file(str(tmp_path / "tiny" / draft / "model.safetensors"))
        for k, v in sd.items():
            if k.endswith("_scale") or k in ("d2t", "t2d"):
                continue
            assert v.dtype == (torch.int8 if v.dim() == 2 else torch.float16), (draft, k)
            assert v.dim() != 2 or sd[k + "_scale"].dtype == torch.float16
    assert "# `tiny`" in (tmp_path / "card.md").read_text()


def test_speed_pair_is_the_deep_pair_only_when_it_ships_whole(tmp_path, monkeypatch):
    import shutil
    small = zoo.WEIGHTS_DIR / zoo.SMALL_NAME
    monkeypatch.setattr(zoo, "WEIGHTS_DIR", tmp_path)
    shutil.copytree(small, tmp_path / zoo.SMALL_NAME)
    assert zoo.speed_pair() == zoo.SMALL_NAME
    deep = tmp_path / zoo.DEEP_NAME
    deep.mkdir()
    shutil.copytree(small / "target", deep / "target")
    shutil.copy(small / "card.json", deep / "card.json")
    assert zoo.DEEP_NAME in zoo.names() and zoo.speed_pair() == zoo.SMALL_NAME  # a target without its drafts
    for draft in zoo.zoo_kinds():
        shutil.copytree(small / draft, deep / draft)
    assert zoo.speed_pair() == zoo.DEEP_NAME


def test_the_model_card_renders_every_shipped_pair_and_why_its_shape():
    cards = [zt.read_card(zoo.WEIGHTS_DIR, n) for n in zoo.names()]
    md = zt.render_model_cards(cards)
    assert all(f"# `{c['name']}`" in md for c in cards)
    deep = dict(cards[0], name=zoo.DEEP_NAME, models={"target": {"num_hidden_layers": 24, "hidden_size": 128}},
                draft_step_cost={"threads": 1, "target_only_step_ms": 5.2, "eagle_draft_forward_ms": 0.5,
                                 "draft_forward_in_target_only_steps": 0.096})
    why = zt.why_this_shape(deep)
    assert "24 layers at hidden 128" in why and "0.096 of a target step" in why


def test_train_a_tiny_deep_target_and_its_eagle3_head():
    """The deep pair's shape in miniature (many layers, narrow, one KV head): the target trains, and its
    EAGLE-3 head reads the peers' default features, low, middle and high."""
    cfg = LlamaConfig(vocab_size=258, hidden_size=16, intermediate_size=40, num_hidden_layers=8,
                      num_attention_heads=2, num_key_value_heads=1)
    opts = zt.StageOpts(steps=3, batch_size=2, seq_len=32, warmup=1, lr=3e-3)
    target, stats = zt.train_target(cfg, opts, seed=0, log=lambda s: None)
    assert stats["steps"] == 3 and math.isfinite(stats["final_train_loss_ema"])
    opts = zt.StageOpts(steps=2, batch_size=2, seq_len=32, warmup=1, extra={"unroll": 2, "draft_vocab_size": 40})
    head, st = zt.train_eagle3(target, opts, seed=0, log=lambda s: None)
    assert st["feature_layers"] == [2, 4, 5] == list(head.feature_layers)


def test_regenerated_segments_are_corpus_prefixes_and_the_target_s_greedy_continuations():
    """The oracle: the target's full-sequence forward, one argmax at a time (no cache, no engine)."""
    target = LlamaForCausalLM(_tiny_target())
    zt.init_weights_(target, 2, 0)
    stream = np.random.default_rng(3).integers(0, 256, size=500).astype(np.uint16)
    seg = zt.regenerate_segments(target, stream, n=3, prefix=7, new_tokens=5, seed=1, batch_size=2, log=lambda s: None)
    assert seg.shape == (3, 12) and seg.dtype == np.uint16
    starts = np.random.default_rng(1).integers(0, len(stream) - 7, size=3)
    for row, s in zip(seg, starts):
        assert row[:7].tolist() == stream[s:s + 7].tolist()
        ids = torch.tensor(stream[s:s + 7].astype(np.int64))[None]
        with torch.no_grad():
            for _ in range(5):
                logits = target(ids, torch.arange(ids.shape[1])[None]).logits[0, -1]
                ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
        assert row[7:].tolist() == ids[0, 7:].tolist()


def test_segment_windows_join_random_segments_to_the_row_length():
    seg = np.arange(5 * 4, dtype=np.uint16).reshape(5, 4)  # segment i holds 4i .. 4i+3
    a, b = zt.SegmentWindows(seg, 3, 10, seed=2), zt.SegmentWindows(seg, 3, 10, seed=2)
    for _ in range(4):
        rows = a.next()
        assert rows.shape == (3, 10) and rows.dtype == torch.int64 and torch.equal(rows, b.next())
        for r in rows.tolist():  # whole segments end to end, the last one cut
            for lo in range(0, 10, 4):
                first = r[lo]
                assert first % 4 == 0 and r[lo:lo + 4] == list(range(first, first + 4))[:len(r[lo:lo + 4])]


def test_heads_train_on_regenerated_segments_and_the_card_says_which(tmp_path):
    target = LlamaForCausalLM(_tiny_target())
    zt.init_weights_(target, 2, 0)
    rng = np.random.default_rng(0)
    for i in (1, 2):
        np.save(tmp_path / f"s{i}.npy", rng.integers(0, 256, size=(3, 20)).astype(np.uint16))
    files = f"{tmp_path / 's1.npy'},{tmp_path / 's2.npy'}"
    opts = zt.StageOpts(steps=1, batch_size=2, seq_len=32, warmup=1, amp=False,
                        extra={"unroll": 2, "regen_data": files})
    for train in (zt.train_eagle, zt.train_eagle3):
        _, st = train(target, opts, seed=0, log=lambda s: None)
        assert st["regen_data"]["files"] == ["s1.npy", "s2.npy"] and st["regen_data"]["segments"] == 6
        assert st["regen_data"]["segment_len"] == 20


@pytest.mark.parametrize("files, says", [("/nonexistent.npy", "no such file"), ("", "no file given")])
def test_bad_regenerated_data_is_refused_before_any_training(capsys, files, says):
    with pytest.raises(SystemExit) as exit_:
        zt.main(["--regen-data", files, "--out", "/nonexistent"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--regen-data: regenerated data" in err and says in err


def test_the_deep_pair_s_heads_trained_on_the_target_s_own_text_and_the_card_says_so():
    deep = zoo.load(zoo.DEEP_NAME)
    text = zt.render_model_card(deep.card)
    for kind in ("eagle", "eagle3"):
        regen = deep.card["training"][kind]["regen_data"]
        assert regen["segments"] == 5600 and regen["segment_len"] == 257, kind
        assert f"`{kind}` trained on the target's own text" in text
    assert "trained on the target's own text" not in zt.render_model_card(zoo.load("stdlib-byte-6l").card)
