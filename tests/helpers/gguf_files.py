"""Small GGUF files written as llama.cpp writes them, from a known model (`gguf.GGUFWriter`): what the GGUF loader's
tests and the commands' end-to-end tests load as a user's own target."""
from __future__ import annotations

import numpy as np

from specdec.models import random_llama


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute, written out from its source."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


#: a decoder layer's modules by their GGUF names
GGUF_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
              "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def byte_vocab():
    """A byte-level BPE vocabulary: 3 control tokens, the 256 byte characters, two merges."""
    # lazy: tokenizers is optional, as gguf is
    from tokenizers.pre_tokenizers import ByteLevel
    chars = sorted(ByteLevel.alphabet())
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + chars + ["Ġt", "Ġth"]
    return tokens, [3, 3, 3] + [1] * (len(tokens) - 3), ["Ġ t", "Ġt h"]


def write_gguf(path, model, arch="llama", qtype=None, tokenizer=True, replace=None):
    """model's weights as llama.cpp writes them: GGUF names, (in, out) shapes, attn_q / attn_k rows permuted in
    Llama files, every matrix in qtype (F32 when None), norms in F32; replace: GGUF name -> (raw bytes, type)
    written instead."""
    c = model.config
    # lazy: gguf is optional (the tests that write files skip without it)
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    if tokenizer:
        tokens, types, merges = byte_vocab()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        a = t.detach().float().numpy()
        if name.startswith("model.layers."):
            i, rest = name.removeprefix("model.layers.").split(".", 1)
            module, kind = rest.rsplit(".", 1)
            g = f"blk.{i}.{GGUF_NAMES[module]}.{kind}"
        else:
            g = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}[name]
        if arch == "llama" and ".attn_q." in g:
            a = llama_cpp_permute(a, c.num_attention_heads)
        elif arch == "llama" and ".attn_k." in g:
            a = llama_cpp_permute(a, c.num_key_value_heads)
        if g in (replace or {}):
            w.add_tensor(g, replace[g][0], raw_dtype=replace[g][1])
        elif a.ndim == 2 and qtype is not None:
            w.add_tensor(g, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(g, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_llama(model_type="llama", **kw):
    """A 2-layer random Llama (or Qwen) of `byte_vocab`'s vocabulary, small enough to write and load in a moment."""
    shape = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                 num_hidden_layers=2, rope_theta=5e4, rms_norm_eps=1e-5, max_position_embeddings=128, seed=3)
    return random_llama(vocab_size=len(byte_vocab()[0]), model_type=model_type, **{**shape, **kw})
