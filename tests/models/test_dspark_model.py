"""The DSpark drafter: a checkpoint in DeepSpec's layout loads; its block forward, Markov-refined logits, confidence
logits and confident length equal DeepSpec's computation written out in float64 from the raw tensors (each of its
Markov head types: vanilla, gated, rnn); a checkpoint
round-trips in that layout; a checkpoint missing a head, naming a head it lacks or holding one it does not name, a
Markov head that is not implemented, or a drafter for another target is a one-line ValueError before any compute."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.models import random_llama
from specdec.models.dspark import DSparkDraftModel, random_dspark
from tests.helpers.dspark import block_through_cache
from tests.helpers.oracles import dspark_block_from_tensors

H, V, L = 32, 64, 4
MASK = 63


@pytest.fixture(scope="module")
def target():
    return random_llama(vocab_size=V, hidden_size=H, num_hidden_layers=L, seed=7, model_type="qwen3")


def deepspec_dir(path, target, layers=2, layer_ids=(-1, 2), block=5, rank=8, markov="vanilla", confidence=True,
                 with_markov=True, seed=0, drop=(), layout=None):
    """A checkpoint directory as DeepSpec's trainer writes one: the target's Qwen3 config with the DSpark fields at
    the top level, tensors under DeepSpec's names (random; the embedding and LM head the target's) -> (config,
    tensors). drop: tensor names left out; layout: rewrites a copy of the config before it is written."""
    Hq, Hkv, D, inter = 4, 2, 8, 48
    cfg = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "hidden_size": H, "vocab_size": V,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": Hq,
           "num_key_value_heads": Hkv, "head_dim": D, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "max_position_embeddings": 128, "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
           "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None,
           "layer_types": ["full_attention"] * layers, "torch_dtype": "bfloat16", "block_size": block,
           "mask_token_id": MASK, "target_layer_ids": list(layer_ids), "num_target_layers": L, "num_anchors": 512,
           "markov_rank": rank, "enable_confidence_head": confidence}
    if rank:
        cfg["markov_head_type"] = markov
    if confidence:
        cfg["confidence_head_with_markov"] = with_markov
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=0.3):
        return torch.randn(*shape, generator=g) * s

    sd = {"embed_tokens.weight": target.model.embed_tokens.weight.detach().clone(),
          "lm_head.weight": target.lm_head.weight.detach().clone(),
          "fc.weight": r(H, len(layer_ids) * H, s=0.2), "hidden_norm.weight": 1 + r(H, s=0.1),
          "norm.weight": 1 + r(H, s=0.1)}
    for i in range(layers):
        p = f"layers.{i}."
        sd.update({p + "self_attn.q_proj.weight": r(Hq * D, H), p + "self_attn.k_proj.weight": r(Hkv * D, H),
                   p + "self_attn.v_proj.weight": r(Hkv * D, H), p + "self_attn.o_proj.weight": r(H, Hq * D),
                   p + "self_attn.q_norm.weight": 1 + r(D, s=0.1), p + "self_attn.k_norm.weight": 1 + r(D, s=0.1),
                   p + "input_layernorm.weight": 1 + r(H, s=0.1),
                   p + "post_attention_layernorm.weight": 1 + r(H, s=0.1),
                   p + "mlp.gate_proj.weight": r(inter, H), p + "mlp.up_proj.weight": r(inter, H),
                   p + "mlp.down_proj.weight": r(H, inter)})
    if rank:
        sd.update({"markov_head.markov_w1.weight": r(V, rank, s=1.0), "markov_head.markov_w2.weight": r(V, rank)})
        if markov == "gated":
            sd.update({"markov_head.gate_proj.weight": r(rank, H + rank), "markov_head.gate_proj.bias": r(rank)})
        if markov == "rnn":
            sd.update({"markov_head.joint_proj.weight": r(3 * rank, 2 * rank + H),
                       "markov_head.joint_proj.bias": r(3 * rank)})
    if confidence:
        sd.update({"confidence_head.proj.weight": r(1, H + (rank if with_markov else 0)),
                   "confidence_head.proj.bias": r(1)})
    for name in drop:
        sd.pop(name)
    path.mkdir(parents=True, exist_ok=True)
    written = json.loads(json.dumps(cfg))
    if layout:
        layout(written)
    (path / "config.json").write_text(json.dumps(written))
    save_file(sd, str(path / "model.safetensors"))
    return cfg, sd


TOKENS = [5, 9, 2, 44, 17, 3, 30]


def _features(target, model, tokens):
    with torch.no_grad():
        return target(torch.tensor([tokens]), torch.arange(len(tokens))[None], features=model.feature_layers).features


@pytest.mark.parametrize("heads", [dict(), dict(markov="gated"), dict(markov="rnn"), dict(with_markov=False),
                                   dict(rank=0), dict(confidence=False)],
                         ids=["vanilla", "gated", "rnn", "confidence-alone", "no-markov", "no-confidence"])
def test_deepspec_checkpoint_block_equals_the_raw_tensor_computation(target, tmp_path, heads):
    if heads.get("rank") == 0:
        heads["with_markov"] = False
    cfg, sd = deepspec_dir(tmp_path, target, **heads)
    model = DSparkDraftModel.from_pretrained(tmp_path, target, confidence_threshold=0.5)
    assert model.feature_layers == (0, 3) and model.block_size == 5 and model.mask_token_id == MASK
    feats = _features(target, model, TOKENS)
    got = block_through_cache(model, feats, 11, 5)
    want = dspark_block_from_tensors(sd, cfg, feats[0], 11, 5, threshold=0.5)
    assert got[0] == want[0]
    assert (got[1].double() - want[1]).abs().max() < 1e-4
    if cfg["enable_confidence_head"]:
        assert (got[2].double() - want[2]).abs().max() < 1e-4
    assert got[3] == want[3]


def test_a_checkpoint_without_the_targets_copies_drafts_with_the_targets_matrices(target, tmp_path):
    """The zoo writes a drafter without DeepSpec's copies of the embedding and LM head; loaded, its block is the
    raw-tensor computation with the target's matrices in their place."""
    cfg, sd = deepspec_dir(tmp_path, target, drop=("embed_tokens.weight", "lm_head.weight"))
    model = DSparkDraftModel.from_pretrained(tmp_path, target, confidence_threshold=0.5)
    feats = _features(target, model, TOKENS)
    got = block_through_cache(model, feats, 11, 5)
    want = dspark_block_from_tensors(dict(sd, **{"embed_tokens.weight": target.model.embed_tokens.weight.detach(),
                                                 "lm_head.weight": target.lm_head.weight.detach()}),
                                     cfg, feats[0], 11, 5, threshold=0.5)
    assert got[0] == want[0] and got[3] == want[3]
    assert (got[1].double() - want[1]).abs().max() < 1e-4


def test_the_confident_length_is_the_first_position_below_the_threshold(target):
    """Worked by hand: sigmoid of [2, 0.5, -1, 3] is [0.88, 0.62, 0.27, 0.95], of 2 0.88, of -3 0.047."""
    model = random_dspark(target, 1, 4, mask_token_id=MASK)
    logits = torch.tensor([[2.0, 0.5, -1.0, 3.0], [2.0, 2.0, 2.0, 2.0], [-3.0, 2.0, 2.0, 2.0]])
    for threshold, want in ((0.5, [2, 4, 0]), (0.7, [1, 4, 0]), (0.9, [0, 0, 0]), (0.0, [4, 4, 4]),
                            (0.05, [4, 4, 0]), (0.3, [2, 4, 0]), (0.25, [4, 4, 0])):
        model.confidence_threshold = threshold
        assert model.confident_length(logits, 4).tolist() == want, threshold


@pytest.mark.parametrize("markov", ["gated", "rnn"])
def test_a_checkpoint_round_trips_in_deepspecs_layout(target, tmp_path, markov):
    cfg, sd = deepspec_dir(tmp_path / "d", target, markov=markov)
    model = DSparkDraftModel.from_pretrained(tmp_path / "d", target)
    model.save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    for key in ("architectures", "block_size", "mask_token_id", "target_layer_ids", "num_target_layers",
                "num_anchors", "markov_rank", "markov_head_type", "enable_confidence_head",
                "confidence_head_with_markov", "num_hidden_layers", "layer_types", "model_type"):
        assert again[key] == cfg[key], key
    saved = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert set(saved) == set(sd) and all(torch.equal(saved[k], sd[k]) for k in sd)
    reloaded = DSparkDraftModel.from_pretrained(tmp_path / "again", target)
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), model.state_dict().values()))


def _one_line_value_error(match, fn):
    with pytest.raises(ValueError, match=match) as e:
        fn()
    assert "\n" not in str(e.value)


def test_checkpoints_that_cannot_draft_are_one_line_value_errors(target, tmp_path):
    load = DSparkDraftModel.from_pretrained
    deepspec_dir(tmp_path / "no-markov", target, drop=("markov_head.markov_w1.weight", "markov_head.markov_w2.weight"))
    _one_line_value_error(r"config.json has markov_rank=8 but the checkpoint holds no markov_head\.\* tensor \(its "
                          r"Markov head is missing\)", lambda: load(tmp_path / "no-markov", target))
    deepspec_dir(tmp_path / "no-conf", target, drop=("confidence_head.proj.weight", "confidence_head.proj.bias"))
    _one_line_value_error(r"enable_confidence_head=True but the checkpoint holds no confidence_head\.\* tensor",
                          lambda: load(tmp_path / "no-conf", target))
    deepspec_dir(tmp_path / "half", target, drop=("confidence_head.proj.bias",))
    _one_line_value_error(r"missing=\['confidence_head.proj.bias'\]", lambda: load(tmp_path / "half", target))
    deepspec_dir(tmp_path / "no-head", target, drop=("lm_head.weight",))
    _one_line_value_error(r"no lm_head\.weight \(the drafter's LM head, a copy of the target's that DeepSpec's "
                          r"checkpoints carry\) beside the other copy", lambda: load(tmp_path / "no-head", target))

    def no_confidence(cfg):
        cfg.update(enable_confidence_head=False)

    deepspec_dir(tmp_path / "unnamed", target, layout=no_confidence)
    _one_line_value_error(r"holds confidence_head\.\* tensors \(a confidence head\) but config.json has "
                          r"enable_confidence_head=False", lambda: load(tmp_path / "unnamed", target))
    deepspec_dir(tmp_path / "made-up", target, layout=lambda cfg: cfg.update(markov_head_type="trigram"))
    _one_line_value_error(r"markov_head_type='trigram' is not implemented \(implemented: vanilla, gated, rnn\)",
                          lambda: load(tmp_path / "made-up", target))
    deepspec_dir(tmp_path / "no-joint", target, markov="rnn", drop=("markov_head.joint_proj.weight",))
    _one_line_value_error(r"missing=\['markov_head.joint_proj.weight'\]", lambda: load(tmp_path / "no-joint", target))
    deepspec_dir(tmp_path / "vanilla-named", target, markov="rnn", layout=lambda cfg: cfg.update(
        markov_head_type="vanilla"))
    _one_line_value_error(r"unexpected=\['markov_head.joint_proj.bias', 'markov_head.joint_proj.weight'\]",
                          lambda: load(tmp_path / "vanilla-named", target))
    deepspec_dir(tmp_path / "no-type", target, layout=lambda cfg: cfg.pop("markov_head_type"))
    _one_line_value_error(r"markov_rank=8 but no markov_head_type", lambda: load(tmp_path / "no-type", target))
    deepspec_dir(tmp_path / "no-block", target, layout=lambda cfg: cfg.pop("block_size"))
    _one_line_value_error(r"no block_size \(DeepSpec's DSpark fields", lambda: load(tmp_path / "no-block", target))
    deepspec_dir(tmp_path / "dflash", target, layout=lambda cfg: cfg.update(architectures=["DFlashDraftModel"]))
    _one_line_value_error(r"architectures=\['DFlashDraftModel'\], expected \['Qwen3DSparkModel'\]",
                          lambda: load(tmp_path / "dflash", target))
    _one_line_value_error(r"confidence_threshold must be in \[0, 1\], got 1.5",
                          lambda: random_dspark(target, confidence_threshold=1.5))


def test_a_drafter_for_another_target_is_a_one_line_value_error(target, tmp_path):
    """Another target of the same shape (DeepSpec's frozen copies of its embedding and head are not this one's), of
    another width, vocabulary or depth, or whose layers the context ids do not fit."""
    deepspec_dir(tmp_path / "ok", target)
    load = DSparkDraftModel.from_pretrained
    twin = random_llama(vocab_size=V, hidden_size=H, num_hidden_layers=L, seed=8, model_type="qwen3")
    _one_line_value_error(r"embed_tokens\.weight differs from the target's by [0-9.]+ of a row's largest value: a "
                          r"drafter for another target", lambda: load(tmp_path / "ok", twin))
    wide = random_llama(vocab_size=V, hidden_size=48, num_hidden_layers=L, seed=1)
    _one_line_value_error(r"draft hidden_size=32 does not match the target's hidden_size=48",
                          lambda: load(tmp_path / "ok", wide))
    other_vocab = random_llama(vocab_size=80, hidden_size=H, num_hidden_layers=L, seed=1)
    _one_line_value_error(r"draft vocab_size=64 does not match the target's vocab_size=80",
                          lambda: load(tmp_path / "ok", other_vocab))
    deeper = random_llama(vocab_size=V, hidden_size=H, num_hidden_layers=6, seed=1)
    _one_line_value_error(r"DSpark drafter num_target_layers=4 does not match the target's num_hidden_layers=6",
                          lambda: load(tmp_path / "ok", deeper))
    deepspec_dir(tmp_path / "ids", target, layer_ids=(-1, 3))
    _one_line_value_error(r"DSpark drafter target_layer_ids \[3\] do not fit the target's 4 layers: ids -1\.\.2",
                          lambda: load(tmp_path / "ids", target))
    deepspec_dir(tmp_path / "low", target, layer_ids=(-2, 1))
    _one_line_value_error(r"target_layer_ids\[0\] must be an int >= -1, got -2", lambda: load(tmp_path / "low", target))


def test_the_zoos_int8_copy_of_the_head_is_still_the_targets(target, tmp_path):
    """A copy rounded to int8 with one scale per row (the zoo's storage) is within the tolerance; a tenth of the
    row's largest value added to one entry is not."""
    cfg, sd = deepspec_dir(tmp_path / "q", target)
    w = sd["lm_head.weight"]
    scale = w.abs().amax(-1, keepdim=True) / 127
    rounded = (w / scale).round().clamp(-127, 127) * scale
    save_file(dict(sd, **{"lm_head.weight": rounded}), str(tmp_path / "q" / "model.safetensors"))
    DSparkDraftModel.from_pretrained(tmp_path / "q", target)
    bumped = w.clone()
    bumped[3, 5] += 0.1 * w[3].abs().max()
    save_file(dict(sd, **{"lm_head.weight": bumped}), str(tmp_path / "q" / "model.safetensors"))
    _one_line_value_error(r"lm_head\.weight differs from the target's by 0\.10",
                          lambda: DSparkDraftModel.from_pretrained(tmp_path / "q", target))
