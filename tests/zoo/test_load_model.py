"""What `--model` and `--draft DIR` name in every command (`zoo.load_model`, `zoo.add_drafts`): a zoo name, a GGUF
file the test writes from a known model, a Hugging Face directory; the target's chat template and stop ids come with
it; a draft directory train-draft wrote loads on its own target and is refused, in one line, on another."""
import pytest
import torch

from tests.helpers.gguf_files import tiny_llama, write_gguf
from specdec import zoo
from specdec.zoo.train.for_target import save_target_draft

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(a GGUF file, the model it was written from), converted into a cache of the test's own."""
    root = tmp_path_factory.mktemp("own")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDEC_CACHE_DIR", str(root / "cache"))
        model = tiny_llama()
        yield write_gguf(root / "tiny.gguf", model), model


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]), torch.arange(len(ids))[None]).logits


def test_a_gguf_file_brings_its_target_chat_template_and_stop_ids(written):
    path, model = written
    b = zoo.load_model(str(path))
    assert b.name == str(path) and b.drafts == {} and b.chat and b.stop_token_ids == [2]
    assert torch.equal(_logits(b.target, [5, 9, 40]), _logits(model, [5, 9, 40]))
    assert b.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert b.ngram is not None  # a draft that needs no weights runs on any target
    # the directory it was converted into is a Hugging Face directory: --model reads it as well
    d = zoo.load_model(str(b.target_dir))
    assert d.target_dir == b.target_dir and d.chat and d.stop_token_ids == [2]
    assert torch.equal(_logits(d.target, [1, 2, 3]), _logits(model, [1, 2, 3]))


def test_zoo_names_load_as_before():
    b = zoo.load_model(zoo.SMALL_NAME)
    assert b.name == zoo.SMALL_NAME and b.eagle is not None and not b.chat and b.stop_token_ids == []
    assert b.target_dir == zoo.WEIGHTS_DIR / zoo.SMALL_NAME / "target"


@pytest.mark.parametrize("what, why", [("missing", "no such file or directory"), ("file", "a file, not a .gguf file"),
                                       ("dir", "a directory without a config.json")])
def test_a_path_that_is_neither_a_gguf_file_nor_a_model_directory_is_one_line(tmp_path, what, why):
    path = {"missing": tmp_path / "nothing-here", "file": tmp_path / "m.bin", "dir": tmp_path}[what]
    if what == "file":
        path.write_bytes(b"x")
    with pytest.raises(ValueError, match=rf"model '{path}' is neither a zoo name .*, a \.gguf file nor a model "
                                         rf"directory \({why}\)") as e:
        zoo.load_model(str(path))
    assert "\n" not in str(e.value)


def test_a_draft_directory_loads_on_its_target_and_is_refused_on_another(written, tmp_path):
    path, model = written
    b = zoo.load_model(str(path))
    fp = zoo.target_fingerprint(b.target)
    # train-draft's --out: one directory per kind; the draft here is the target itself, stored as a draft LM
    save_target_draft(model, tmp_path / "out" / "draft_lm", fp)
    assert zoo.add_drafts(b, tmp_path / "out") == ["draft_lm"]
    assert torch.allclose(_logits(b.draft_lm, [7, 8]), _logits(model, [7, 8]), atol=1e-2)  # stored in float16
    one = zoo.load_model(str(path), drafts=[tmp_path / "out" / "draft_lm"])  # or one draft's own directory
    assert list(one.drafts) == ["draft_lm"]
    with pytest.raises(ValueError, match=rf"the draft_lm draft in .* was trained for target {fp}, not this target"):
        zoo.load_model(zoo.SMALL_NAME, drafts=[tmp_path / "out"])
    with pytest.raises(ValueError, match=r"draft directory '.*empty' holds no draft"):
        (tmp_path / "empty").mkdir()
        zoo.add_drafts(b, tmp_path / "empty")
    with pytest.raises(ValueError, match=r"draft directory '.*missing': no such directory"):
        zoo.add_drafts(b, tmp_path / "missing")
