"""Text in, text out: tokenizer.json through `tokenizers`, EOS as the default stop, `specdec generate`."""
import json
import re

import pytest
import torch

from specdec import Engine, SamplingParams
from specdec.cli import main
from specdec.models import LlamaForCausalLM
from specdec.text import generate_text
from specdec.tokenizer import HFTokenizer, Tokenizer, load_tokenizer

ZOO = "specdec/zoo/weights/stdlib-byte-6l"
TEXT = "Grüße, 世界! Ελληνικά — naïve café 🚀 def f(x): return x**2"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random Llama written by transformers, with a byte-level BPE tokenizer.json (BOS added on encode)."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers
    path = tmp_path_factory.mktemp("hf_model")
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT, "the quick brown fox jumps over the lazy dog"] * 20, trainer)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tok.save(str(path / "tokenizer.json"))
    cfg = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, bos_token_id=bos, eos_token_id=eos)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def test_tokenizer_json_round_trips_multilingual_text(hf_dir):
    tok = load_tokenizer(hf_dir)
    assert isinstance(tok, HFTokenizer) and isinstance(tok, Tokenizer)
    ids = tok.encode(TEXT)
    assert ids[0] == tok._tok.token_to_id("<s>")  # the post-processor's BOS
    assert tok.decode(ids) == TEXT
    assert tok.eos_token_ids == [tok._tok.token_to_id("</s>")]


def test_the_generation_config_eos_is_the_default_stop(hf_dir):
    tok = load_tokenizer(hf_dir)
    target = LlamaForCausalLM.from_pretrained(hf_dir)
    engine = Engine(target, max_seq_len=128)
    free = engine.generate([tok.encode("hello")], SamplingParams(max_new_tokens=12))[0].token_ids
    stop = free[4]
    stops = [stop, tok.eos_token_ids[0]]
    (hf_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}))
    try:
        tok = load_tokenizer(hf_dir)
        out = generate_text(engine, tok, ["hello"], SamplingParams(max_new_tokens=12))[0]
    finally:
        (hf_dir / "generation_config.json").unlink()
    first = min(free.index(t) for t in stops if t in free)  # whichever end-of-sequence id comes first
    assert out.output.token_ids == free[:first + 1] and out.output.finish_reason == "stop"
    assert out.text == tok.decode(free[:first])


def test_generate_streams_what_it_returns():
    from specdec import zoo
    b = zoo.load("stdlib-byte-6l")
    engine = Engine(b.target, b.eagle, __import__("specdec").SpecConfig(3, 2, 6), max_seq_len=256)
    pieces = []
    out = generate_text(engine, b.tokenizer, ["import sys\n"], SamplingParams(max_new_tokens=30),
                        stream=lambda r, ids: pieces.append((r, list(ids))))[0]
    assert [t for _, ids in pieces for t in ids] == out.output.token_ids and {r for r, _ in pieces} == {0}
    assert len(pieces) == len(out.output.accept_lens) + 1  # the prefill's token, then one piece per step


@pytest.mark.parametrize("extra", [[], ["--draft", f"{ZOO}/eagle"], ["--draft", f"{ZOO}/mtp"],
                                   ["--draft", f"{ZOO}/mtp_chain", "--num-steps", "3"]])
def test_cli_generate_on_the_shipped_models(capsys, extra):
    assert main(["generate", "--target", f"{ZOO}/target", "--max-new-tokens", "24", "def main(", *extra]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def main(") and "tokens/s" in out and "accepted per step" in out


def test_cli_generate_takes_the_penalties(capsys):
    """The penalty flags reach the engine: an EAGLE run prints what target-only prints under the same flags (the
    exact mode is lossless), and what the flags change is visible against a run without them."""
    flags = ["--max-new-tokens", "40", "--repetition-penalty", "1.6", "--frequency-penalty", "0.5",
             "--presence-penalty", "0.3", "--min-new-tokens", "3", "--logit-bias", "32=1.5", "def main("]
    texts = []
    for extra in ([], ["--draft", f"{ZOO}/eagle"], ["--draft", f"{ZOO}/eagle", "--penalty-mode", "exact"]):
        assert main(["generate", "--target", f"{ZOO}/target", *extra, *flags]) == 0
        texts.append(capsys.readouterr().out.split("\n\n[")[0])
    assert texts[0] == texts[1] == texts[2]
    assert main(["generate", "--target", f"{ZOO}/target", "--max-new-tokens", "40", "def main("]) == 0
    assert capsys.readouterr().out.split("\n\n[")[0] != texts[0]


def test_cli_generate_on_a_transformers_model(hf_dir, capsys):
    assert main(["generate", "--target", str(hf_dir), "--max-new-tokens", "8", "--temperature", "0.7", TEXT]) == 0
    assert capsys.readouterr().out.startswith(TEXT)


@pytest.mark.parametrize("argv, message", [
    (["--target", "/no/such/dir"], "--target /no/such/dir: no such directory"),
    (["--target", f"{ZOO}/target", "--draft", "/no/such/draft"], "--draft /no/such/draft: no such directory"),
    (["--target", f"{ZOO}/target", "--draft-layout", "mtp-mimo"], "number of MTP layers"),
    (["--target", f"{ZOO}/target", "--draft-layout", "eagle"], "needs --draft DIR"),
    (["--target", f"{ZOO}/target", "--logit-bias", "10:2"], "--logit-bias '10:2': expected ID=BIAS"),
    (["--target", f"{ZOO}/target", "--repetition-penalty", "0"], "repetition_penalty must be a finite number > 0"),
    (["--target", f"{ZOO}/target", "--min-new-tokens", "99"], "min_new_tokens must be an int in [0, 64], got 99"),
])
def test_cli_generate_errors_are_one_line(capsys, argv, message):
    assert main(["generate", *argv, "hello"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_directory_without_a_tokenizer_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable tokenizer.json"):
        load_tokenizer(tmp_path)


def test_cli_generate_with_an_eagle3_checkpoint(tmp_path, capsys):
    from specdec import zoo
    from specdec.models import random_eagle3_head
    random_eagle3_head(zoo.load("stdlib-byte-6l").target, draft_vocab_size=100, seed=0).save_pretrained(tmp_path)
    assert main(["generate", "--target", f"{ZOO}/target", "--draft", str(tmp_path), "--max-new-tokens", "12",
                 "def f("]) == 0
    assert "Eagle3DraftHead" in capsys.readouterr().out


def test_cli_generate_takes_a_grammar(tmp_path, capsys):
    pytest.importorskip("xgrammar")
    schema = tmp_path / "schema.json"
    integer = {"type": "integer", "minimum": 0, "maximum": 999}
    schema.write_text(json.dumps({"type": "object", "properties": {"id": integer}, "required": ["id"]}))
    grammar = tmp_path / "g.ebnf"
    grammar.write_text('root ::= "def " [a-z]+ "():"')
    for flags, check in ((["--json-schema", str(schema)], lambda t: json.loads(t)["id"] is not None),
                         (["--regex", r"[a-z_]{1,8}"], lambda t: re.fullmatch(r"[a-z_]{1,8}", t)),
                         (["--ebnf", str(grammar)], lambda t: re.fullmatch(r"def [a-z]+\(\):", t))):
        assert main(["generate", "--target", f"{ZOO}/target", "--draft", f"{ZOO}/eagle", "--max-new-tokens", "40",
                     "--draft-grammar", *flags, "x = "]) == 0
        out = capsys.readouterr().out
        assert check(out.split("\n\n[")[0].removeprefix("x = ")), out
    assert main(["generate", "--target", f"{ZOO}/target", "--regex", "[a-", "x"]) == 1
    err = capsys.readouterr().err
    assert "its regex does not compile" in err and len(err.strip().splitlines()) == 1


def test_a_grammar_on_a_tokenizer_json_model(hf_dir, capsys):
    pytest.importorskip("xgrammar")
    assert main(["generate", "--target", str(hf_dir), "--max-new-tokens", "30", "--regex", r"(fox|dog) [a-z]{2,5}",
                 TEXT]) == 0
    out = capsys.readouterr().out.split("\n\n[")[0].removeprefix(TEXT)
    assert re.fullmatch(r"(fox|dog) [a-z]{2,5}", out), out
