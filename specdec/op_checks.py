"""Argument checks of the ops, shared by `reference` and `fast` (one definition of a valid call).

Only shapes, dtypes and Python values are checked: nothing here reads a tensor's values, so the
checks cost no host synchronisation inside a decode step.
"""
from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass

import torch

#: Every op a worker reaches through its ops module (`reference` or `fast`): a module can run the
#: workers only when it has all of them, with the reference's signatures.
WORKER_OPS = (
    "softmax_topk",
    "select_top_k_tokens",
    "organize_draft_results",
    "build_tree_kernel_efficient",
    "verify_tree_greedy",
    "tree_speculative_sampling_target_only",
    "compute_spec_v2_logprobs",
    "softmax_with_temperature",
    "top_k_renorm_prob",
    "top_p_renorm_prob",
    "plan_tree_attention",
    "apply_rope_and_write_kv",
    "tree_attention",
    "commit_kv_cache",
)


def check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {name}={value}")
    return value


def check_tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...], what: str = "") -> None:
    if tuple(t.shape) != tuple(expected):
        hint = f" ({what})" if what else ""
        raise ValueError(f"{name} must have shape {tuple(expected)}{hint}, got {tuple(t.shape)}")


def check_same_device(device, **tensors) -> None:
    """Every named tensor must be on `device` (the op's first tensor argument's)."""
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, the op's other tensors on {device}")


def check_integer_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must have an integer dtype, got {t.dtype}")


def check_float_dtype(name: str, t: torch.Tensor) -> None:
    if not t.dtype.is_floating_point:
        raise TypeError(f"{name} must have a floating-point dtype, got {t.dtype}")


def max_num_draft_tokens(topk: int, spec_steps: int) -> int:
    """``(topk, spec_steps) -> int``: the largest tree size W = 1 + K + (S-1)K^2 (root included)."""
    return 1 + topk + (spec_steps - 1) * topk * topk


def check_tree_size(name: str, num_tokens, topk: int, spec_steps: int) -> int:
    check_int(name, num_tokens, 2)
    hi = max_num_draft_tokens(topk, spec_steps)
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
    for name, t in (
        ("bonus_tokens", bonus_tokens),
        ("parent_list", parent_list),
        ("top_scores_index", top_scores_index),
        ("draft_tokens", draft_tokens),
        ("seq_lens", seq_lens),
    ):
        check_tensor(name, t)
        check_integer_dtype(name, t)
    if bonus_tokens.dim() != 1:
        raise ValueError(f"bonus_tokens must have shape (B,), got {tuple(bonus_tokens.shape)}")
    B = bonus_tokens.shape[0]
    P = 1 + K * (S - 1) if S > 1 else 0
    check_shape("parent_list", parent_list, (B, P), f"(B, 1 + topk*(spec_steps-1)) with spec_steps={S}")
    check_shape("top_scores_index", top_scores_index, (B, W - 1), f"(B, num_verify_tokens - 1), W={W}")
    check_shape("draft_tokens", draft_tokens, (B, W - 1), f"(B, num_verify_tokens - 1), W={W}")
    check_shape("seq_lens", seq_lens, (B,))
    check_same_device(bonus_tokens.device, parent_list=parent_list, top_scores_index=top_scores_index,
                      draft_tokens=draft_tokens, seq_lens=seq_lens)
    return B, W


def check_tree_args(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling, num_steps):
    if isinstance(num_steps, bool) or not isinstance(num_steps, int):
        raise TypeError(f"num_steps must be an int, got {type(num_steps).__name__} ({num_steps!r})")
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got num_steps={num_steps}")
    check_tensor("candidates", candidates)
    if candidates.dim() != 2:
        raise ValueError(f"candidates must have shape (B, W), got {tuple(candidates.shape)}")
    B, W = candidates.shape
    if W < 1:
        raise ValueError(
            f"candidates must hold at least the root (W >= 1), got shape {tuple(candidates.shape)}"
        )
    check_integer_dtype("candidates", candidates)
    for name, t in (
        ("retrieve_index", retrieve_index),
        ("retrieve_next_token", retrieve_next_token),
        ("retrieve_next_sibling", retrieve_next_sibling),
    ):
        check_tensor(name, t)
        check_shape(name, t, (B, W))
        check_integer_dtype(name, t)
    check_same_device(candidates.device, retrieve_index=retrieve_index, retrieve_next_token=retrieve_next_token,
                      retrieve_next_sibling=retrieve_next_sibling)
    return B, W


def check_sampling_args(
    B, W, uniform_samples, uniform_samples_for_final_sampling, target_probs, threshold_single, threshold_acc,
    device=None,
):
    check_tensor("uniform_samples", uniform_samples)
    check_shape("uniform_samples", uniform_samples, (B, W))
    check_float_dtype("uniform_samples", uniform_samples)
    check_tensor("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling)
    check_shape("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, (B,))
    check_float_dtype("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling)
    check_tensor("target_probs", target_probs)
    if target_probs.dim() != 3 or tuple(target_probs.shape[:2]) != (B, W) or target_probs.shape[2] < 1:
        raise ValueError(
            f"target_probs must have shape ({B}, {W}, V) with V >= 1, got {tuple(target_probs.shape)}"
        )
    check_float_dtype("target_probs", target_probs)
    if device is not None:
        check_same_device(device, uniform_samples=uniform_samples, target_probs=target_probs,
                          uniform_samples_for_final_sampling=uniform_samples_for_final_sampling)
    for name, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a float, got {type(value).__name__} ({value!r})")
    for name, value in (("threshold_single", threshold_single), ("threshold_acc", threshold_acc)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {name}={value}")
    if threshold_single < 1.0 or threshold_acc < 1.0:
        warn_lossy_thresholds(threshold_single, threshold_acc)
    return target_probs.shape[2]


_warned_lossy_thresholds = False


def warn_lossy_thresholds(threshold_single, threshold_acc) -> None:
    """Once per process: thresholds below 1 are SGLang's relaxed acceptance, not lossless sampling."""
    global _warned_lossy_thresholds
    if not _warned_lossy_thresholds:
        _warned_lossy_thresholds = True
        warnings.warn(f"tree_speculative_sampling_target_only: threshold_single={threshold_single}, "
                      f"threshold_acc={threshold_acc} accept more than the target allows; the output is no "
                      f"longer distributed as the target's (thresholds 1.0 are lossless)", stacklevel=3)


def as_int(value, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}") from None


def check_int_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got dtype {t.dtype}")


def check_logprob_args(batch, logits_output, predict, accept_index, speculative_num_steps, scale):
    """Python-side checks only (shapes, dtypes, devices, list contents): no tensor value is read."""
    S = as_int(speculative_num_steps, "speculative_num_steps")
    if S < 0:
        raise ValueError(f"speculative_num_steps must be >= 0, got {S}")

    check_int_tensor(accept_index, "accept_index")
    if accept_index.dim() != 2:
        raise ValueError(
            f"accept_index must be 2-D [B, speculative_num_steps + 1], got shape {tuple(accept_index.shape)}"
        )
    B = accept_index.shape[0]
    if accept_index.shape[1] != S + 1:
        raise ValueError(
            f"accept_index has {accept_index.shape[1]} slots per request but speculative_num_steps + 1 "
            f"= {S + 1} (shape {tuple(accept_index.shape)})"
        )

    logits = logits_output.next_token_logits
    if not isinstance(logits, torch.Tensor):
        raise TypeError(
            f"logits_output.next_token_logits must be a torch.Tensor, got {type(logits).__name__}"
        )
    if not logits.dtype.is_floating_point:
        raise TypeError(f"logits_output.next_token_logits must be floating point, got dtype {logits.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"next_token_logits must be 2-D [B*W, V], got shape {tuple(logits.shape)}")
    N, V = logits.shape
    if V == 0:
        raise ValueError(f"next_token_logits has an empty vocabulary (shape {tuple(logits.shape)})")
    if B == 0:
        if N != 0:
            raise ValueError(f"accept_index has 0 requests but next_token_logits has {N} rows")
        W = 0
    else:
        if N == 0 or N % B != 0:
            raise ValueError(
                f"next_token_logits has {N} rows, not a positive multiple of the batch size B = {B} "
                f"(accept_index shape {tuple(accept_index.shape)})"
            )
        W = N // B

    check_int_tensor(predict, "predict")
    if predict.dim() != 1 or predict.shape[0] != N:
        raise ValueError(
            f"predict must be 1-D [B*W] = [{N}] (one token per logits row), got shape {tuple(predict.shape)}"
        )
    for name, t in (("accept_index", accept_index), ("predict", predict)):
        if t.device != logits.device:
            raise ValueError(f"{name} is on {t.device} but next_token_logits is on {logits.device}")

    seq_lens = getattr(batch, "seq_lens", None)
    if seq_lens is not None and len(seq_lens) != B:
        raise ValueError(f"batch.seq_lens has {len(seq_lens)} entries but accept_index has B = {B} requests")

    temperatures = None
    if scale:
        temperatures = batch.sampling_info.temperatures
        if not isinstance(temperatures, torch.Tensor):
            raise TypeError(
                f"batch.sampling_info.temperatures must be a torch.Tensor [B, 1], got {type(temperatures).__name__}"
            )
        if not temperatures.dtype.is_floating_point:
            raise TypeError(
                f"batch.sampling_info.temperatures must be floating point, got {temperatures.dtype}"
            )
        if tuple(temperatures.shape) != (B, 1):
            raise ValueError(
                f"batch.sampling_info.temperatures must have shape [B, 1] = [{B}, 1], "
                f"got {tuple(temperatures.shape)}"
            )
        if temperatures.device != logits.device:
            raise ValueError(
                f"batch.sampling_info.temperatures is on {temperatures.device} but next_token_logits is on "
                f"{logits.device}"
            )

    top_nums = getattr(batch, "top_logprobs_nums", None)
    if top_nums is None:
        top_nums = [0] * B
    if len(top_nums) != B:
        raise ValueError(
            f"batch.top_logprobs_nums has {len(top_nums)} entries but the batch has B = {B} requests"
        )
    top_nums = [as_int(k, f"batch.top_logprobs_nums[{b}]") for b, k in enumerate(top_nums)]
    for b, k in enumerate(top_nums):
        if k < 0 or k > V:
            raise ValueError(f"request {b}: top_logprobs_num = {k} is outside [0, vocab size {V}]")

    token_ids = getattr(batch, "token_ids_logprobs", None)
    if token_ids is None:
        token_ids = [None] * B
    if len(token_ids) != B:
        raise ValueError(
            f"batch.token_ids_logprobs has {len(token_ids)} entries but the batch has B = {B} requests"
        )
    ids_per_req: list[list[int]] = []
    for b, ids in enumerate(token_ids):
        if ids is None:
            ids_per_req.append([])
            continue
        if isinstance(ids, (str, bytes, torch.Tensor)) or not hasattr(ids, "__iter__"):
            raise TypeError(
                f"request {b}: token_ids_logprobs must be a list of ints or None, got {type(ids).__name__}"
            )
        clean = [as_int(t, f"request {b}: token_ids_logprobs[{i}]") for i, t in enumerate(ids)]
        for i, t in enumerate(clean):
            if t < 0 or t >= V:
                raise ValueError(
                    f"request {b}: token_ids_logprobs[{i}] = {t} is outside the vocabulary [0, {V})"
                )
        ids_per_req.append(clean)

    return B, S, W, V, temperatures, top_nums, ids_per_req


def check_commit_kv_args(kv, slots, seq_lens, accept_index, num_draft_tokens) -> tuple[int, int]:
    """Shapes, dtypes and devices of `commit_kv_cache`'s arguments -> (B, S+1). Values are trusted."""
    check_tensor("kv", kv)
    if kv.dim() != 5:
        raise ValueError(f"kv must have shape (N, max_batch, max_seq_len, Hkv, D), got {tuple(kv.shape)}")
    check_float_dtype("kv", kv)
    check_tensor("accept_index", accept_index)
    check_integer_dtype("accept_index", accept_index)
    if accept_index.dim() != 2 or accept_index.shape[1] < 1:
        raise ValueError(f"accept_index must have shape (B, S+1), got {tuple(accept_index.shape)}")
    B, S1 = accept_index.shape
    for name, t in (("slots", slots), ("seq_lens", seq_lens)):
        check_row_params(name, t, B, kv.device, integer=True)
    check_int("num_draft_tokens", num_draft_tokens, 1)
    if accept_index.device != kv.device:
        raise ValueError(f"accept_index is on {accept_index.device} but kv is on {kv.device}")
    return B, S1


def check_row_params(name: str, t, N: int, device, integer: bool) -> None:
    """`t` must be an (N,) tensor of one value per row (or request) on `device`, integer or floating point."""
    check_tensor(name, t)
    check_shape(name, t, (N,), "one value per row")
    if integer:
        check_integer_dtype(name, t)
    else:
        check_float_dtype(name, t)
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the rows are on {device}")


def check_rows(name: str, t, fp32_only: bool) -> tuple[int, int]:
    """`t` must be an (N, V) floating-point tensor with V >= 1 (float32 when `fp32_only`); -> (N, V)."""
    check_tensor(name, t)
    if t.dim() != 2 or t.shape[1] < 1:
        raise ValueError(f"{name} must have shape (N, V) with V >= 1, got {tuple(t.shape)}")
    if fp32_only and t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {t.dtype}")
    check_float_dtype(name, t)
    return t.shape[0], t.shape[1]


def check_softmax_with_temperature_args(logits, temperatures) -> tuple[int, int]:
    """logits: (N, V) floating point; temperatures: (N,) floating point, same device -> (N, V)."""
    N, V = check_rows("logits", logits, fp32_only=False)
    check_row_params("temperatures", temperatures, N, logits.device, integer=False)
    return N, V


def check_renorm_prob_args(probs, param_name: str, param, integer: bool) -> tuple[int, int]:
    """probs: (N, V) float32; `param` (top_ks or top_ps): (N,), integer or floating point -> (N, V)."""
    N, V = check_rows("probs", probs, fp32_only=True)
    check_row_params(param_name, param, N, probs.device, integer)
    return N, V


def check_softmax_topk_args(logits, topk) -> tuple[int, int]:
    """`softmax_topk`'s arguments -> (N, V)."""
    N, V = check_rows("logits", logits, fp32_only=False)
    check_int("topk", topk, 1)
    if topk > V:
        raise ValueError(f"topk={topk} exceeds the vocabulary size V={V}")
    return N, V


def _check_cache_pair(k_cache, v_cache, device) -> tuple[int, int, int, int]:
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t)
        check_float_dtype(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (max_batch, max_seq_len, Hkv, D), got {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but q is on {device}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
    return tuple(k_cache.shape)


def check_attention_args(q, k_cache, v_cache, slots, cache_start, write_offset, tree_mask, attn_len, scale):
    """`tree_attention`'s arguments -> (B, T, Hq, D). Values (slots, lengths) are trusted."""
    check_tensor("q", q)
    check_float_dtype("q", q)
    if q.dim() != 4:
        raise ValueError(f"q must have shape (B, T, Hq, D), got {tuple(q.shape)}")
    B, T, Hq, D = q.shape
    _, max_seq, Hkv, Dk = _check_cache_pair(k_cache, v_cache, q.device)
    if Dk != D:
        raise ValueError(f"the cache's head_dim {Dk} differs from q's head_dim {D}")
    if Hq % Hkv:
        raise ValueError(f"q has {Hq} heads, not a multiple of the cache's {Hkv} KV heads")
    _check_key_span(B, T, q.device, slots, cache_start, write_offset, tree_mask, attn_len, max_seq)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale must be a positive float, got {scale!r}")
    return B, T, Hq, D


def check_rope_kv_args(q, k, v, cos, sin, k_cache, v_cache, slots, cache_start, write_offset):
    """`apply_rope_and_write_kv`'s arguments -> (B, T, Hq, D). Values (slots, lengths) are trusted."""
    check_tensor("q", q)
    check_float_dtype("q", q)
    if q.dim() != 4:
        raise ValueError(f"q must have shape (B, T, Hq, D), got {tuple(q.shape)}")
    B, T, Hq, D = q.shape
    if D % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {D}")
    _, max_seq, Hkv, Dk = _check_cache_pair(k_cache, v_cache, q.device)
    for name, t in (("k", k), ("v", v)):
        check_tensor(name, t)
        check_float_dtype(name, t)
        check_shape(name, t, (B, T, Hkv, D), "(B, T, Hkv, D) with the cache's Hkv and q's D")
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t)
        check_float_dtype(name, t)
        check_shape(name, t, (B, T, D), "(B, T, D)")
    if Dk != D:
        raise ValueError(f"the cache's head_dim {Dk} differs from q's head_dim {D}")
    for name, t in (("slots", slots), ("cache_start", cache_start)):
        check_row_params(name, t, B, q.device, integer=True)
    check_int("write_offset", write_offset, 0)
    if write_offset + T > max_seq:
        raise ValueError(f"write_offset={write_offset} + T={T} new tokens exceed the cache's {max_seq} slots")
    return B, T, Hq, D


@dataclass(frozen=True)
class TreeAttentionPlan:
    """What every layer of one forward shares: built once by an ops module's `plan_tree_attention`, read
    by the same module's `apply_rope_and_write_kv` and `tree_attention` (FlashInfer's plan / run split).

    impl: the building module's name (a plan is read only by the ops that built it); batch, num_new,
    write_offset, attn_len, max_seq_len: the call it was built for; tensors: the module's precomputed
    masks and indices."""

    impl: str
    batch: int
    num_new: int
    write_offset: int
    attn_len: int
    max_seq_len: int
    tensors: dict


def check_plan_args(slots, cache_start, write_offset, tree_mask, attn_len, num_new, max_seq_len) -> int:
    """`plan_tree_attention`'s arguments -> B."""
    check_tensor("slots", slots)
    if slots.dim() != 1:
        raise ValueError(f"slots must have shape (B,), got {tuple(slots.shape)}")
    B = slots.shape[0]
    check_int("num_new", num_new, 1)
    check_int("max_seq_len", max_seq_len, 1)
    _check_key_span(B, num_new, slots.device, slots, cache_start, write_offset, tree_mask, attn_len, max_seq_len)
    return B


def _check_key_span(B, T, device, slots, cache_start, write_offset, tree_mask, attn_len, max_seq_len) -> None:
    """What attention and its plan share: the rows, where the T new tokens go, and what they may see."""
    for name, t in (("slots", slots), ("cache_start", cache_start)):
        check_row_params(name, t, B, device, integer=True)
    check_int("write_offset", write_offset, 0)
    check_int("attn_len", attn_len, 1)
    if write_offset + T > max_seq_len:
        raise ValueError(f"write_offset={write_offset} + T={T} new tokens exceed the cache's {max_seq_len} slots")
    if attn_len > max_seq_len:
        raise ValueError(f"attn_len={attn_len} exceeds the cache's max_seq_len={max_seq_len}")
    if tree_mask is not None:
        check_tensor("tree_mask", tree_mask)
        if tree_mask.dtype != torch.bool:
            raise TypeError(f"tree_mask must be a bool tensor, got dtype {tree_mask.dtype}")
        check_shape("tree_mask", tree_mask, (B, T, write_offset + T), "(B, T, write_offset + T)")
        check_same_device(device, tree_mask=tree_mask)


def check_plan(plan, impl: str, B: int, T: int, write_offset: int, attn_len: int | None, max_seq_len: int) -> None:
    """A plan handed to an op must be this module's and built for this call's shapes."""
    if not isinstance(plan, TreeAttentionPlan):
        raise TypeError(f"plan must be a TreeAttentionPlan from plan_tree_attention, got {type(plan).__name__}")
    if plan.impl != impl:
        raise ValueError(f"plan was built by {plan.impl!r}'s plan_tree_attention; this op is {impl!r}'s")
    got = (plan.batch, plan.num_new, plan.write_offset, plan.max_seq_len)
    want = (B, T, write_offset, max_seq_len)
    if got != want or (attn_len is not None and plan.attn_len != attn_len):
        raise ValueError(f"plan was built for (B, T, write_offset, max_seq_len, attn_len) = {got + (plan.attn_len,)}, "
                         f"this call has {want + (attn_len,)}")
