"""Chat prompts from the standard library's docstrings: split by source module, deterministic, and rendered through
a tokenizer's chat template (the byte tokenizer's, and SmolLM2's against transformers' rendering of the same
tokenizer files)."""
import hashlib
import re

import pytest

from tests.helpers import installed_gguf
from specdec import zoo
from specdec.tokenizer import ByteTokenizer
from specdec.zoo.chat_prompts import TEMPLATES, chat_prompt_ids, chat_prompts, sources, subjects

REAL = zoo.REAL_TARGETS["smollm2-135m-instruct"]
# a name's split by hand: sha256 % 5 of "xi", "phi", "omega" is 0 (held out); of "alpha", "beta", "eta" it is not
FAKE_STDLIB = {
    "alpha.py": '"""Alpha: the first module of the fake library."""\n'
                'def tally(items):\n    """Count the items and return a dict of counts."""\n',
    "beta/__init__.py": '"""Beta: a package whose submodule documents more."""\n',
    "beta/inner.py": 'class Box:\n    """A box that holds one value at a time."""\n'
                     '    def put(self, v):\n        """Put v in the box, replacing its value."""\n'
                     '    def _hidden(self):\n        """A private method, never a subject."""\n',
    "eta.py": 'def short():\n    """Too short."""\n',
    "xi.py": '"""Xi: a held-out module with one documented function."""\n'
             'def spread(x, n):\n    """Spread x over n buckets, as evenly as they allow."""\n',
    "phi/__init__.py": '"""Phi: a held-out package of documented helpers."""\n',
    "phi/deep.py": 'async def fetch(url):\n    """Fetch url and return its body as bytes."""\n',
    "_private.py": '"""A private module: never a source of prompts."""\n',
    "omega.py": 'def broken(:\n    """A file that does not parse gives no subjects."""\n',
}


def _held_out_by_hand(name: str) -> bool:
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % 5 == 0


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("stdlib")
    for rel, text in FAKE_STDLIB.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_fake_library_splits_by_source_module(fake_root):
    assert [_held_out_by_hand(n) for n in ("xi", "phi", "omega", "alpha", "beta", "eta")] == [True] * 3 + [False] * 3
    assert sources("train", fake_root) == ["alpha", "beta"]
    assert sources("heldout", fake_root) == ["phi", "xi"]
    assert sorted(s.name for s in subjects("train", fake_root)) == [
        "alpha", "alpha.tally", "beta", "beta.inner.Box", "beta.inner.Box.put"]
    assert sorted(s.name for s in subjects("heldout", fake_root)) == ["phi", "phi.deep.fetch", "xi", "xi.spread"]


def test_prompts_are_deterministic_and_name_their_subject(fake_root):
    a = chat_prompts("heldout", 4, seed=3, root=fake_root)
    assert a == chat_prompts("heldout", 4, seed=3, root=fake_root)
    assert len(a) == 4 and all(len(m) == 1 and m[0]["role"] == "user" for m in a)
    named = sorted(re.search(r"`([^`]+)`", m[0]["content"]).group(1) for m in a)
    assert named == ["phi", "phi.deep.fetch", "xi", "xi.spread"]  # all four subjects, each once
    with pytest.raises(ValueError, match="n=5 exceeds the 4"):
        chat_prompts("heldout", 5, root=fake_root)
    with pytest.raises(ValueError, match="split must be"):
        chat_prompts("test", 1, root=fake_root)


def test_every_template_fills_from_a_docstring(fake_root):
    texts = {m[0]["content"] for seed in range(40) for m in chat_prompts("train", 5, seed=seed, root=fake_root)}
    # each template's fixed words appear in some prompt, and none is left with a placeholder
    for template in TEMPLATES:
        head = template.split("`{name}`")[0]
        assert any(t.startswith(head) for t in texts), template
    assert not any("{" in t for t in texts)
    assert "Explain what `alpha.tally` does and give a short example." in texts


def test_the_standard_library_split_is_disjoint_and_reproducible():
    train, held = sources("train"), sources("heldout")
    assert train and held and not set(train) & set(held)
    assert all(_held_out_by_hand(s) for s in held) and not any(_held_out_by_hand(s) for s in train)
    first = chat_prompts("heldout", 8, seed=0)
    assert first == chat_prompts("heldout", 8, seed=0) and first != chat_prompts("heldout", 8, seed=1)
    for messages in first:
        name = re.search(r"`([^`]+)`", messages[0]["content"]).group(1)
        assert name.split(".")[0] in held
    assert len({m[0]["content"] for m in chat_prompts("train", 50, seed=0)}) == 50


def test_prompts_render_through_the_byte_tokenizers_template():
    tok = ByteTokenizer()
    ids = chat_prompt_ids(tok, "heldout", 3, seed=0)
    for messages, got in zip(chat_prompts("heldout", 3, seed=0), ids):
        assert got == list(f"user: {messages[0]['content']}\nassistant: ".encode())



@pytest.mark.skipif(installed_gguf() is None, reason=f"SmolLM2 is not installed ({REAL.install_command})")
def test_prompts_render_through_smollm2s_template_as_transformers_renders_them():
    transformers = pytest.importorskip("transformers")
    from specdec.models.gguf import cached_gguf_dir, load_gguf_tokenizer
    path = installed_gguf()
    hf = transformers.AutoTokenizer.from_pretrained(cached_gguf_dir(path))
    ids = chat_prompt_ids(load_gguf_tokenizer(path), "heldout", 4, seed=0)
    for messages, got in zip(chat_prompts("heldout", 4, seed=0), ids):
        want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        want = want["input_ids"] if hasattr(want, "keys") else want
        assert got == list(want)
        assert got[-4:] == hf.encode("<|im_start|>assistant\n", add_special_tokens=False)
