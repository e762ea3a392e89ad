"""The ops' argument checks: one definition of a valid call for each op, shared by `reference` and `fast`, built
from the check vocabulary of `specdec.checks` (its module docstring has the rules: what a bad value raises, no
tensor value read, nothing checked inside `trusted_calls()`).
"""
from __future__ import annotations

import warnings

import torch

# calls_are_trusted(), not checks._TRUSTED: the GPU check's Inductor run swaps that module global for a plain flag
from ..checks import ArgumentTypeError, calls_are_trusted, check_int, check_ints, check_real, check_tensor
from .contract import TreeAttentionPlan, max_num_draft_tokens


def check_tree_size(name: str, num_tokens, topk: int, spec_steps: int) -> int:
    hi = max_num_draft_tokens(topk, spec_steps)
    check_int(name, num_tokens, 2)
    if num_tokens > hi:
        raise ValueError(
            f"{name}={num_tokens} is out of range: with topk={topk} and spec_steps={spec_steps} "
            f"it must lie in [2, 1 + K + (S-1)K^2] = [2, {hi}]"
        )
    return num_tokens


def check_build_tree_args(
    bonus_tokens, parent_list, top_scores_index, draft_tokens, seq_lens, topk, spec_steps, num_verify_tokens
) -> tuple[int, int]:
    K = check_int("topk", topk, 1)
    S = check_int("spec_steps", spec_steps, 1)
    W = check_tree_size("num_verify_tokens", num_verify_tokens, K, S)
    check_tensor("bonus_tokens", bonus_tokens, "int", (None,))
    B, device = bonus_tokens.shape[0], bonus_tokens.device
    P = 1 + K * (S - 1) if S > 1 else 0
    check_tensor("parent_list", parent_list, "int", (B, P), device,
                 f"(B, 1 + topk*(spec_steps-1)) with spec_steps={S}")
    check_tensor("top_scores_index", top_scores_index, "int", (B, W - 1), device,
                 f"(B, num_verify_tokens - 1), W={W}")
    check_tensor("draft_tokens", draft_tokens, "int", (B, W - 1), device, f"(B, num_verify_tokens - 1), W={W}")
    check_tensor("seq_lens", seq_lens, "int", (B,), device)
    return B, W


def check_tree_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, num_steps):
    check_int("num_steps", num_steps, 1)
    check_tensor("candidates", candidates, shape=(None, None), what="B, W")
    B, W = candidates.shape
    if W < 1:
        raise ValueError(f"candidates must hold at least the root (W >= 1), got shape {tuple(candidates.shape)}")
    check_tensor("candidates", candidates, "int")
    for name, t in (
        ("retrieve_index", retrieve_index),
        ("retrieve_next_token", retrieve_next_token),
        ("retrieve_next_sibling", retrieve_next_sibling),
    ):
        check_tensor(name, t, "int", (B, W), candidates.device)
    return B, W


def check_verify_greedy_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, target_predict,
                             num_steps) -> tuple[int, int]:
    """`verify_tree_greedy`'s arguments -> (B, W)."""
    B, W = check_tree_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, num_steps)
    check_tensor("target_predict", target_predict, "int", (B, W), candidates.device)
    return B, W


def check_sampling_args(
    B, W, uniform_samples, uniform_samples_for_final_sampling, target_probs, threshold_single, threshold_acc,
    device=None,
):
    check_tensor("uniform_samples", uniform_samples, "float", (B, W), device)
    check_tensor("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, "float", (B,), device)
    check_tensor("target_probs", target_probs, shape=(B, W, None), what="B, W, V")
    if target_probs.shape[2] < 1:
        raise ValueError(f"target_probs must have shape ({B}, {W}, V) with V >= 1, got {tuple(target_probs.shape)}")
    check_tensor("target_probs", target_probs, "float", device=device)
    threshold_single = check_real("threshold_single", threshold_single, 0.0, 1.0)
    threshold_acc = check_real("threshold_acc", threshold_acc, 0.0, 1.0)
    if threshold_single < 1.0 or threshold_acc < 1.0:
        warn_lossy_thresholds(threshold_single, threshold_acc)
    return target_probs.shape[2]


def check_draft_probs_args(B, W, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
                           device=None) -> int:
    """The sampling arguments of the verify ops that read the draft's distribution -> V."""
    check_tensor("uniform_samples", uniform_samples, "float", (B, W), device)
    check_tensor("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, "float", (B,), device)
    check_tensor("target_probs", target_probs, "float", (B, W, None), device, "B, W, V")
    V = target_probs.shape[2]
    if V < 1:
        raise ValueError(f"target_probs must have shape ({B}, {W}, V) with V >= 1, got {tuple(target_probs.shape)}")
    check_tensor("draft_probs", draft_probs, "float", (B, W, V), device, "B, W, V: the target_probs' shape")
    return V


def check_sample_without_replacement_args(probs, uniforms) -> tuple[int, int, int]:
    """`sample_without_replacement`'s arguments -> (N, V, K)."""
    N, V = check_rows("probs", probs, fp32_only=False)
    check_tensor("uniforms", uniforms, "float", (N, None), probs.device, "N, K: one uniform per draw")
    K = uniforms.shape[1]
    if not 1 <= K <= V:
        raise ValueError(f"uniforms must have 1 <= K <= V={V} columns (draws per row), got {K}")
    return N, V, K


_warned_lossy_thresholds = False


def warn_lossy_thresholds(threshold_single, threshold_acc) -> None:
    """Once per process: thresholds below 1 are SGLang's relaxed acceptance, not lossless sampling."""
    global _warned_lossy_thresholds
    if not _warned_lossy_thresholds:
        _warned_lossy_thresholds = True
        warnings.warn(f"tree_speculative_sampling_target_only: threshold_single={threshold_single}, "
                      f"threshold_acc={threshold_acc} accept more than the target allows; the output is no "
                      f"longer distributed as the target's (thresholds 1.0 are lossless)", stacklevel=3)


def _per_request(name: str, values, B: int, default) -> list:
    """A batch field with one entry per request (None: `default` for all)."""
    if values is None:
        return [default] * B
    if len(values) != B:
        raise ValueError(f"{name} has {len(values)} entries but the batch has B = {B} requests")
    return list(values)


def check_logprob_args(batch, logits_output, predict, accept_index, speculative_num_steps, scale):
    """Python-side checks only (shapes, dtypes, devices, list contents): no tensor value is read."""
    S = check_int("speculative_num_steps", speculative_num_steps, 0)
    logits = check_tensor("logits_output.next_token_logits", logits_output.next_token_logits, "float",
                          (None, None), what="B*W, V")
    N, V = logits.shape
    if V == 0:
        raise ValueError(f"next_token_logits has an empty vocabulary (shape {tuple(logits.shape)})")
    check_tensor("accept_index", accept_index, "int", (None, S + 1), logits.device,
                 "B, speculative_num_steps + 1")
    B = accept_index.shape[0]
    if B == 0 and N != 0:
        raise ValueError(f"accept_index has 0 requests but next_token_logits has {N} rows")
    if B and (N == 0 or N % B):
        raise ValueError(f"next_token_logits has {N} rows, not a positive multiple of the batch size B = {B} "
                         f"(accept_index shape {tuple(accept_index.shape)})")
    W = N // B if B else 0
    check_tensor("predict", predict, "int", (N,), logits.device, "B*W: one token per logits row")

    seq_lens = getattr(batch, "seq_lens", None)
    if seq_lens is not None and len(seq_lens) != B:
        raise ValueError(f"batch.seq_lens has {len(seq_lens)} entries but accept_index has B = {B} requests")
    temperatures = None
    if scale:
        temperatures = check_tensor("batch.sampling_info.temperatures", batch.sampling_info.temperatures, "float",
                                    (B, 1), logits.device)

    top_nums = _per_request("batch.top_logprobs_nums", getattr(batch, "top_logprobs_nums", None), B, 0)
    top_nums = check_ints(lambda b: f"request {b}: top_logprobs_num", top_nums, 0, V)
    ids_per_req: list[list[int]] = []
    for b, ids in enumerate(_per_request("batch.token_ids_logprobs", getattr(batch, "token_ids_logprobs", None),
                                         B, None)):
        if ids is None:
            ids_per_req.append([])
            continue
        if isinstance(ids, (str, bytes, torch.Tensor)) or not hasattr(ids, "__iter__"):
            raise ArgumentTypeError(
                f"request {b}: token_ids_logprobs must be a list of ints or None, got {type(ids).__name__}")
        ids_per_req.append(check_ints(lambda i, b=b: f"request {b}: token_ids_logprobs[{i}]", ids, 0, V - 1))
    return B, S, W, V, temperatures, top_nums, ids_per_req


def check_commit_kv_args(kv, slots, seq_lens, accept_index, num_draft_tokens) -> tuple[int, int]:
    """Shapes, dtypes and devices of `commit_kv_cache`'s arguments -> (B, S+1). Values are trusted."""
    check_tensor("kv", kv, "float", (None,) * 5, what="N, max_batch, max_seq_len, Hkv, D")
    check_tensor("accept_index", accept_index, "int", (None, None), kv.device, "B, S+1")
    B, S1 = accept_index.shape
    if S1 < 1:
        raise ValueError(f"accept_index must have shape (B, S+1), got {tuple(accept_index.shape)}")
    for name, t in (("slots", slots), ("seq_lens", seq_lens)):
        check_tensor(name, t, "int", (B,), kv.device, "one value per row")
    check_int("num_draft_tokens", num_draft_tokens, 1)
    return B, S1


def check_rows(name: str, t, fp32_only: bool) -> tuple[int, int]:
    """`t` must be an (N, V) floating-point tensor with V >= 1 (float32 when `fp32_only`); -> (N, V)."""
    check_tensor(name, t, "float32" if fp32_only else "float", (None, None), what="N, V")
    if t.shape[1] < 1:
        raise ValueError(f"{name} must have shape (N, V) with V >= 1, got {tuple(t.shape)}")
    return t.shape[0], t.shape[1]


def check_softmax_with_temperature_args(logits, temperatures) -> tuple[int, int]:
    """logits: (N, V) floating point; temperatures: (N,) floating point, same device -> (N, V)."""
    N, V = check_rows("logits", logits, fp32_only=False)
    check_tensor("temperatures", temperatures, "float", (N,), logits.device, "one value per row")
    return N, V


def check_renorm_prob_args(probs, param_name: str, param, integer: bool) -> tuple[int, int]:
    """probs: (N, V) float32; `param` (top_ks or top_ps): (N,), integer or floating point -> (N, V)."""
    N, V = check_rows("probs", probs, fp32_only=True)
    check_tensor(param_name, param, "int" if integer else "float", (N,), probs.device, "one value per row")
    return N, V


def check_argmax_finite_args(logits) -> tuple[int, int]:
    """`argmax_finite`'s argument -> (N, V)."""
    return check_rows("logits", logits, fp32_only=False)


def check_softmax_topk_args(logits, topk) -> tuple[int, int]:
    """`softmax_topk`'s arguments -> (N, V)."""
    N, V = check_rows("logits", logits, fp32_only=False)
    check_int("topk", topk, 1)
    if topk > V:
        raise ValueError(f"topk={topk} exceeds the vocabulary size V={V}")
    return N, V


def _check_cache_pair(k_cache, v_cache, device) -> tuple[int, int, int, int]:
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t, "float", (None,) * 4, device, "max_batch, max_seq_len, Hkv, D")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
    return tuple(k_cache.shape)


def _check_query(q) -> tuple[int, int, int, int]:
    check_tensor("q", q, "float", (None,) * 4, what="B, T, Hq, D")
    return tuple(q.shape)


def _same_signature(args, checked_args) -> bool:
    """Whether two calls' arguments have the same signature, what the ops' argument checks read of them: a
    tensor's shape, dtype and device, any other value itself (equal signatures pass or fail the same checks).
    The same object is compared first: the layers of a forward share most of their arguments (slots, lengths,
    cos and sin) and differ in the rest only by object."""
    for a, b in zip(args, checked_args):
        if a is b:
            continue
        if isinstance(a, torch.Tensor):
            if not (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
                    and a.device == b.device):
                return False
        elif isinstance(b, torch.Tensor) or a != b:
            return False
    return True


def _once_per_plan(plan, op: str, args: tuple, check, check_against_plan):
    """`check(*args)` and, when a plan is given, `check_against_plan(result)` -> check's result. With a plan, both
    run once per argument signature (`_same_signature`), remembered in `plan.checked` with the arguments
    they passed: the layers of one forward share its plan and pass arguments of the same shapes, so a 24-layer
    forward checks its attention arguments once, not 24 times (about a tenth of a small model's decode step on
    a CPU)."""
    if plan is None:
        return check(*args)
    seen = plan.checked.get(op) if isinstance(plan, TreeAttentionPlan) else None
    if seen is not None and _same_signature(args, seen[0]):
        return seen[1]
    result = check(*args)
    check_against_plan(result)
    plan.checked[op] = (args, result)
    return result


def check_attention_call(impl: str, plan, q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask, attn_len,
                         scale):
    """`tree_attention`'s arguments (`check_attention_args`) and its plan (`check_plan`), once per plan and
    argument signature -> (B, T, Hq, D)."""
    if calls_are_trusted():
        return q.shape
    args = (q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask, attn_len, scale)
    return _once_per_plan(plan, "tree_attention", args, check_attention_args, lambda r: check_plan(
        plan, impl, r[0], r[1], write_offset, attn_len, k_cache.shape[1]))


def check_rope_kv_call(impl: str, plan, q, k, v, cos, sin, k_cache, v_cache, slots, cache_start, write_offset):
    """`apply_rope_and_write_kv`'s arguments (`check_rope_kv_args`) and its plan (`check_plan`), once per plan and
    argument signature -> (B, T, Hq, D)."""
    if calls_are_trusted():
        return q.shape
    args = (q, k, v, cos, sin, k_cache, v_cache, slots, cache_start, write_offset)
    return _once_per_plan(plan, "apply_rope_and_write_kv", args, check_rope_kv_args, lambda r: check_plan(
        plan, impl, r[0], r[1], write_offset, None, k_cache.shape[1]))


def check_attention_args(q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask, attn_len, scale):
    """`tree_attention`'s arguments -> (B, T, Hq, D). Values (slots, lengths) are trusted."""
    B, T, Hq, D = _check_query(q)
    _, max_seq, Hkv, Dk = _check_cache_pair(k_cache, v_cache, q.device)
    if Dk != D:
        raise ValueError(f"the cache's head_dim {Dk} differs from q's head_dim {D}")
    if Hq % Hkv:
        raise ValueError(f"q has {Hq} heads, not a multiple of the cache's {Hkv} KV heads")
    _check_key_span(B, T, q.device, slots, cache_start, write_offset, tree_mask, attn_len, max_seq)
    if check_real("scale", scale) <= 0:
        raise ValueError(f"scale must be a positive float, got {scale!r}")
    return B, T, Hq, D


def check_rope_kv_args(q, k, v, cos, sin, k_cache, v_cache, slots, cache_start, write_offset):
    """`apply_rope_and_write_kv`'s arguments -> (B, T, Hq, D). Values (slots, lengths) are trusted."""
    B, T, Hq, D = _check_query(q)
    if D % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {D}")
    _, max_seq, Hkv, Dk = _check_cache_pair(k_cache, v_cache, q.device)
    for name, t in (("k", k), ("v", v)):
        check_tensor(name, t, "float", (B, T, Hkv, D), what="(B, T, Hkv, D) with the cache's Hkv and q's D")
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, "float", (B, T, D), what="B, T, D")
    if Dk != D:
        raise ValueError(f"the cache's head_dim {Dk} differs from q's head_dim {D}")
    for name, t in (("slots", slots), ("cache_start", cache_start)):
        check_tensor(name, t, "int", (B,), q.device, "one value per row")
    check_int("write_offset", write_offset, 0)
    if write_offset + T > max_seq:
        raise ValueError(f"write_offset={write_offset} + T={T} new tokens exceed the cache's {max_seq} slots")
    return B, T, Hq, D


def check_plan_args(slots, cache_start, write_offset, tree_mask, attn_len, num_new, max_seq_len) -> int:
    """`plan_tree_attention`'s arguments -> B."""
    check_tensor("slots", slots, shape=(None,), what="B")
    B = slots.shape[0]
    check_int("num_new", num_new, 1)
    check_int("max_seq_len", max_seq_len, 1)
    _check_key_span(B, num_new, slots.device, slots, cache_start, write_offset, tree_mask, attn_len, max_seq_len)
    return B


def _check_key_span(B, T, device, slots, cache_start, write_offset, tree_mask, attn_len, max_seq_len) -> None:
    """What attention and its plan share: the rows, where the T new tokens go, and what they may see."""
    for name, t in (("slots", slots), ("cache_start", cache_start)):
        check_tensor(name, t, "int", (B,), device, "one value per row")
    check_int("write_offset", write_offset, 0)
    check_int("attn_len", attn_len, 1)
    if write_offset + T > max_seq_len:
        raise ValueError(f"write_offset={write_offset} + T={T} new tokens exceed the cache's {max_seq_len} slots")
    if attn_len > max_seq_len:
        raise ValueError(f"attn_len={attn_len} exceeds the cache's max_seq_len={max_seq_len}")
    if tree_mask is not None:
        check_tensor("tree_mask", tree_mask, "bool", (B, T, write_offset + T), device, "B, T, write_offset + T")


def check_plan(plan, impl: str, B: int, T: int, write_offset: int, attn_len: int | None, max_seq_len: int) -> None:
    """A plan handed to an op must be this module's and built for this call's shapes."""
    if not isinstance(plan, TreeAttentionPlan):
        raise ArgumentTypeError(f"plan must be a TreeAttentionPlan from plan_tree_attention, got "
                                f"{type(plan).__name__}")
    if plan.impl != impl:
        raise ValueError(f"plan was built by {plan.impl!r}'s plan_tree_attention; this op is {impl!r}'s")
    got = (plan.batch, plan.num_new, plan.write_offset, plan.max_seq_len)
    want = (B, T, write_offset, max_seq_len)
    if got != want or (attn_len is not None and plan.attn_len != attn_len):
        raise ValueError(f"plan was built for (B, T, write_offset, max_seq_len, attn_len) = {got + (plan.attn_len,)}, "
                         f"this call has {want + (attn_len,)}")


def check_penalty_args(logits, candidates, tree_mask, output_counts, prompt_mask, output_lens, frequency_penalties,
                       presence_penalties, repetition_penalties, min_new_tokens, stop_mask, logit_bias
                       ) -> tuple[int, int, int, int]:
    """`apply_penalties_tree`'s arguments -> (B, R, W, V): R logits rows per request (tree_mask.shape[1], or W
    without a mask), W candidates per request. Values (counts, penalties) are trusted."""
    check_tensor("candidates", candidates, "int", (None, None), what="B, W")
    B, W = candidates.shape
    device = candidates.device
    R = W
    if tree_mask is not None:
        check_tensor("tree_mask", tree_mask, "bool", (B, None, W), device, "B, R, W")
        R = tree_mask.shape[1]
    check_tensor("logits", logits, "float", (B * R, None), device, "B*R, V")
    V = logits.shape[1]
    if V < 1:
        raise ValueError(f"logits must have shape (B*R, V) with V >= 1, got {tuple(logits.shape)}")
    check_tensor("output_counts", output_counts, "int", (B, V), device, "B, V")
    for name, t in (("prompt_mask", prompt_mask), ("stop_mask", stop_mask)):
        check_tensor(name, t, "bool", (B, V), device, "B, V")
    check_tensor("logit_bias", logit_bias, "float", (B, V), device, "B, V")
    for name, t, kind in (("output_lens", output_lens, "int"), ("frequency_penalties", frequency_penalties, "float"),
                          ("presence_penalties", presence_penalties, "float"),
                          ("repetition_penalties", repetition_penalties, "float"),
                          ("min_new_tokens", min_new_tokens, "int")):
        check_tensor(name, t, kind, (B,), device, "one value per request")
    return B, R, W, V


def check_bitmask_args(logits, bitmask) -> tuple[int, int]:
    """`apply_token_bitmask`'s arguments -> (N, V): logits (N, V) float, bitmask (N, ceil(V / 32)) int32 on the
    logits' device (xgrammar's packed layout: bit j of word i allows token 32 i + j). Values are trusted."""
    check_tensor("logits", logits, "float", (None, None), what="N, V")
    N, V = logits.shape
    if V < 1:
        raise ValueError(f"logits must have shape (N, V) with V >= 1, got {tuple(logits.shape)}")
    check_tensor("bitmask", bitmask, "int32", (N, (V + 31) // 32), logits.device, "N, ceil(V/32)")
    return N, V


def check_rms_norm_args(x, residual, weight, eps) -> tuple[int, int]:
    """`rms_norm`'s and `fused_add_rms_norm`'s arguments -> (N, H): x (N, H) float with H >= 1, residual None or
    (N, H) of x's dtype, weight (H,) float, all on x's device; eps a number >= 0. Values are trusted."""
    check_tensor("x", x, "float", (None, None), what="N, H")
    N, H = x.shape
    if H < 1:
        raise ValueError(f"x must have shape (N, H) with H >= 1, got {tuple(x.shape)}")
    if residual is not None:
        check_tensor("residual", residual, "float", (N, H), x.device, "N, H of x")
        if residual.dtype != x.dtype and not calls_are_trusted():
            raise ValueError(f"residual must have x's dtype {x.dtype}, got {residual.dtype}")
    check_tensor("weight", weight, "float", (H,), x.device, "H of x")
    check_real("eps", eps, 0.0)
    return N, H


#: The dtypes `silu_and_mul` takes (the models' activation dtypes; the kernel's math is fp32)
SILU_AND_MUL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_silu_and_mul_args(x) -> tuple[int, int]:
    """`silu_and_mul`'s argument -> (N, I): x (N, 2I) of float32, bfloat16 or float16, gate then up, with 2I even
    and >= 2. Values are trusted."""
    check_tensor("x", x, "float", (None, None), what="N, 2I")
    if x.dtype not in SILU_AND_MUL_DTYPES and not calls_are_trusted():
        raise ArgumentTypeError(f"x must have a float32, bfloat16 or float16 dtype, got {x.dtype}")
    N, width = x.shape
    if width < 2 or width % 2:
        raise ValueError(f"x must have shape (N, 2I) with an even last dimension 2I >= 2, got {tuple(x.shape)}")
    return N, width // 2
