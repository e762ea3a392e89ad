"""The fast path in a process where something else imported triton first.

Each case runs in a fresh interpreter with TRITON_INTERPRET unset, as in a user's notebook: a
transformers model is loaded (transformers imports triton while it does so) or triton is imported bare,
then `fast` decodes. The oracle is plain target-only decoding with the reference ops in the same process.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

LOAD_TRANSFORMERS_MODEL = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
hf = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2))
hf.save_pretrained(tmp)
hf = LlamaForCausalLM.from_pretrained(tmp).eval()
with torch.no_grad():
    hf(torch.tensor([[1, 2, 3]]))
"""

DECODE_FAST_AND_COMPARE = """
assert "triton" in sys.modules, "the case must import triton before fast"
from specdec import Engine, SamplingParams, SpecConfig, zoo
bundle = zoo.load("stdlib-byte-6l")
prompts = [bundle.tokenizer.encode("def fibonacci(n):\\n")]
params = SamplingParams(max_new_tokens=6, return_logprob=True)
baseline = Engine(bundle.target, impl="reference").generate(prompts, params)
cases = {"EAGLE tree": (bundle.eagle, SpecConfig(num_steps=2, topk=2, num_draft_tokens=4)),
         "MTP chain": (bundle.mtp_chain, SpecConfig(num_steps=3))}
for name, (draft, spec) in cases.items():
    out = Engine(bundle.target, draft=draft, spec=spec, impl="fast").generate(prompts, params)
    for b, o in zip(baseline, out):
        assert o.token_ids == b.token_ids, (name, o.token_ids, b.token_ids)
        diff = max(abs(x - y) for x, y in zip(o.logprobs, b.logprobs))
        assert diff < 1e-4, (name, diff)
print("OK")
"""


def _run_fresh(prelude: str, tmp_path) -> subprocess.CompletedProcess:
    code = f"import sys\ntmp = {str(tmp_path)!r}\n" + textwrap.dedent(prelude) + DECODE_FAST_AND_COMPARE
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is the CPU path")
# CI imports triton first; a transformers model loaded first (which imports it too) runs with -m slow
@pytest.mark.parametrize("prelude", [pytest.param(LOAD_TRANSFORMERS_MODEL, marks=pytest.mark.slow), "import triton\n"],
                         ids=["transformers-model", "triton"])
def test_fast_workers_are_lossless_after_triton_was_imported(prelude, tmp_path):
    run = _run_fresh(prelude, tmp_path)
    assert run.returncode == 0 and run.stdout.strip().endswith("OK"), run.stderr[-3000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is the CPU path")
def test_fast_on_a_cpu_with_the_interpreter_turned_off_is_a_clear_error(tmp_path):
    code = textwrap.dedent("""
        import pytest
        from specdec import Engine, zoo
        with pytest.raises(ValueError, match="TRITON_INTERPRET='0' turns it off"):
            Engine(zoo.load("stdlib-byte-6l").target, impl="fast")
        print("OK")
    """)
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("OK"), run.stderr[-3000:]
