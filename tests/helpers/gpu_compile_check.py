"""Compile every fast kernel for an NVIDIA H100/H200 (sm_90) without a GPU: a check that the kernels are
valid compiled Triton, not only valid for Triton's CPU interpreter.

Run as a script (`python -m tests.helpers.gpu_compile_check [--dtypes bfloat16,float32]`, TRITON_INTERPRET unset). A
stand-in driver reports an sm_90 target; each kernel launch compiles the kernel with exactly the signature,
specialisation and constexprs a GPU run with the same arguments would, through Triton's own ptxas, and launches
nothing (the ops' outputs are left uninitialised). Prints a JSON line with the triton version, then one per
compiled variant. --dtypes: the logit / activation dtypes to compile for (default: fp32, bf16 and fp16; every
kernel is reached under each).
"""
from __future__ import annotations

import json
import os
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("gpu_compile_check needs TRITON_INTERPRET unset")
os.environ["TRITON_INTERPRET"] = "0"  # importing `fast` on a machine without CUDA would otherwise turn it on

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


class _Sm90WithoutDevice:
    """The few driver calls a launch makes before it compiles."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return TARGET

    def get_active_torch_device(self):
        return torch.device("cpu")


_original_do_compile = JITFunction._do_compile
_seen = set()


def _compile_only(self, key, signature, device, constexprs, options, attrs, warmup):
    # the key is the specialisation alone: two kernels with the same signature share it
    if (self.fn.__module__, self.fn.__qualname__, key) not in _seen:
        _seen.add((self.fn.__module__, self.fn.__qualname__, key))
        kernel = _original_do_compile(self, key, signature, device, constexprs, options, attrs, warmup)
        self.device_caches[device][0].pop(key, None)
        print(json.dumps(dict(kernel=self.fn.__name__, num_warps=options.num_warps, shared=kernel.metadata.shared,
                              **_resource_usage(kernel.asm["cubin"]),
                              constexprs={str(k): repr(v) for k, v in constexprs.items()})), flush=True)
    return None


def _resource_usage(cubin: bytes) -> dict:
    """Registers and spill bytes per thread of a cubin, from the cuobjdump that ships with Triton."""
    import re
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", out)
    spill = re.search(r"STACK:(\d+)", out)
    return dict(registers=int(regs.group(1)) if regs else None, stack_bytes=int(spill.group(1)) if spill else None)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def exercise_every_op(dtypes=None):
    """Call every fast op in the configurations the workers and tests use (logits in each of `dtypes`)."""
    dtypes = tuple(DTYPES.values()) if dtypes is None else dtypes
    import fast
    from fast.argmax import argmax_finite_launch
    from fast.draft import SPLIT_KEYS_CAP, softmax_topk_launch
    from fast.logprobs import compute_spec_v2_logprobs_launch
    from specdec.gpu_check.bandwidth import SHAPES as READ_SHAPES
    from specdec.gpu_check.bandwidth import read_sum
    from specdec.ops.logprob_types import LogitsOutput, SamplingInfo, SpecBatch
    from specdec.models.layers import rope_cos_sin

    gen = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        # logprobs: scaled / greedy, top-k off / on / above the cap, token ids, one and several splits
        B, T, V = 2, 3, 5000
        logits = torch.randn(B * T, V, generator=gen).to(dtype)
        predict = torch.randint(V, (B * T,), generator=gen)
        accept = torch.tensor([[0, 1, -1], [3, 4, 5]], dtype=torch.int32)
        for greedy, top, ids in ((False, 0, None), (True, 5, [[1, 2], None]), (False, 40, [[7], [8, 9, 10]])):
            batch = SpecBatch(torch.zeros(B), SamplingInfo(torch.ones(B, 1), greedy), [top] * B, ids)
            fast.compute_spec_v2_logprobs(batch, LogitsOutput(next_token_logits=logits), predict, accept, T - 1)
        compute_spec_v2_logprobs_launch(logits, predict, accept, torch.ones(B), None, 8, _num_splits=4)
        # sampling filters and the draft's top-K
        probs = fast.softmax_with_temperature(logits, torch.ones(B * T))
        fast.top_k_renorm_prob(probs, torch.full((B * T,), 5))
        fast.top_p_renorm_prob(probs, torch.full((B * T,), 0.9))
        for k in (1, 4):
            fast.softmax_topk(logits, k)  # one program per row at this vocabulary
            softmax_topk_launch(logits, k, split_len=1024)  # the vocabulary split over programs, and the merge
        # the greedy pick: one program per row, and the vocabulary split with the merge
        fast.argmax_finite(logits)
        argmax_finite_launch(torch.randn(1, 64 * 1024).to(dtype), split_len=1024)
        # the largest merge the heuristic launches: 64 splits of SPLIT_KEYS_CAP keys
        softmax_topk_launch(torch.randn(1, 64 * 1024).to(dtype), SPLIT_KEYS_CAP, split_len=1024)
        # attention and RoPE + KV write
        for Hq, Hkv, D, T_new, offset, tree in ((4, 2, 64, 16, 0, True), (8, 2, 128, 1, 0, False),
                                                 (4, 4, 64, 4, 8, True), (32, 8, 128, 40, 0, False)):
            q = torch.randn(2, T_new, Hq, D).to(dtype)
            k = torch.randn(2, T_new, Hkv, D).to(dtype)
            caches = [torch.zeros(3, 256, Hkv, D, dtype=dtype) for _ in range(2)]
            slots, start = torch.tensor([0, 2]), torch.tensor([5, 100])
            cos, sin = rope_cos_sin(start[:, None] + torch.arange(T_new), D, 10000.0)
            q = fast.apply_rope_and_write_kv(q, k, k, cos, sin, *caches, slots, start, offset)
            mask = torch.ones(2, T_new, offset + T_new, dtype=torch.bool) if tree else None
            fast.tree_attention(q, *caches, slots, start, offset, mask, 200, D ** -0.5)
        # penalties: a tree and the root-only approximation
        Bp, Wp, Vp = 2, 4, 5000
        cand = torch.randint(Vp, (Bp, Wp), generator=gen)
        tree = torch.ones(Wp, Wp, dtype=torch.bool).tril().expand(Bp, Wp, Wp)
        per_req = [torch.zeros(Bp, Vp, dtype=torch.int32), torch.zeros(Bp, Vp, dtype=torch.bool), torch.zeros(Bp),
                   torch.ones(Bp), torch.ones(Bp), torch.ones(Bp), torch.zeros(Bp, dtype=torch.int64),
                   torch.zeros(Bp, Vp, dtype=torch.bool), torch.zeros(Bp, Vp)]
        per_req[2] = per_req[2].long()
        for mask in (tree, None):
            fast.apply_penalties_tree(torch.randn(Bp * Wp, Vp).to(dtype), cand, mask, *per_req)
        # the grammar's packed bitmask
        fast.apply_token_bitmask(torch.randn(Bp * Wp, Vp).to(dtype),
                                 torch.full((Bp * Wp, (Vp + 31) // 32), -1, dtype=torch.int32))
        # commit
        kv = torch.zeros(4, 3, 64, 2, 64, dtype=dtype)
        fast.commit_kv_cache(kv, torch.tensor([0, 1]), torch.tensor([3, 9]), accept, 3)
        for H in (64, 576, 2048, 9000):
            x = torch.randn(3, H).to(dtype)
            fast.rms_norm(x, torch.ones(H, dtype=dtype), 1e-5)
            fast.fused_add_rms_norm(x, x, torch.ones(H, dtype=dtype), 1e-5)
            fast.silu_and_mul(torch.randn(3, 2 * H).to(dtype))
        # gpu-check's read-bandwidth probe (not an op of the step) at each launch shape it tries: a ragged last program
        for block, iters, warps in READ_SHAPES:
            read_sum(torch.randn(2 * 65536 + 5).to(dtype), None, block, iters, warps)
    # tree build and both verifies, small and large trees
    from fast.verify import tree_speculative_sampling_target_only, verify_tree_greedy
    for S, K, W in ((3, 1, 4), (5, 4, 16), (5, 4, 69)):
        import reference
        score_list, token_list, parents_list = [], [], []
        topk_p = torch.rand(2, K, generator=gen).sort(-1, descending=True).values
        topk_index = torch.randint(100, (2, K), generator=gen)
        hidden, scores = torch.zeros(2, 4), None
        for i in range(S):
            _, hidden, scores, info = reference.select_top_k_tokens(i, topk_p, topk_index, hidden, scores, K)
            for lst, x in zip((score_list, token_list, parents_list), info):
                lst.append(x)
            topk_p = torch.rand(2 * K, K, generator=gen).sort(-1, descending=True).values
            topk_index = torch.randint(100, (2 * K, K), generator=gen)
        plist, tsi, dtok = reference.organize_draft_results(score_list, token_list, parents_list, W)
        _, _, ri, nt, ns, flat = fast.build_tree_kernel_efficient(torch.tensor([1, 2]), plist, tsi, dtok,
                                                                  torch.tensor([5, 6]), K, S, W)
        # the stand-in launches nothing: the tree outputs above are uninitialised, so verify reads a valid tree
        ri_ok, nt_ok, ns_ok, flat_ok = reference.build_tree_kernel_efficient(
            torch.tensor([1, 2]), plist, tsi, dtok, torch.tensor([5, 6]), K, S, W)[2:]
        cand = flat_ok.view(2, W)
        verify_tree_greedy(cand, ri_ok, nt_ok, ns_ok, cand, S)
        for dtype in [d for d in dtypes if d != torch.float16] or [torch.float32]:
            probs = torch.softmax(torch.randn(2, W, 300, generator=gen), -1).to(dtype)
            tree_speculative_sampling_target_only(cand, ri_ok, nt_ok, ns_ok, torch.rand(2, W), torch.rand(2), probs, S)
            tree_speculative_sampling_target_only(cand, ri_ok, nt_ok, ns_ok, torch.rand(2, W), torch.rand(2), probs, S,
                                                  0.5, 0.5)
            draft_probs = torch.softmax(torch.randn(2, W, 300, generator=gen), -1).to(dtype)
            fast.tree_speculative_sampling_rejection(cand, ri_ok, nt_ok, ns_ok, torch.rand(2, W), torch.rand(2), probs,
                                                     draft_probs, S)
            fast.tree_speculative_sampling_traversal(cand, ri_ok, nt_ok, ns_ok, torch.rand(2, W), torch.rand(2), probs,
                                                     draft_probs, S)
            if K == 1:
                fast.chain_speculative_sampling_block(cand, ri_ok, torch.rand(2, W), torch.rand(2), probs, draft_probs,
                                                      S)
            fast.sample_without_replacement(draft_probs.view(2 * W, 300), torch.rand(2 * W, K))
        del ri, nt, ns, flat


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.gpu_compile_check")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma-separated, of {', '.join(DTYPES)}")
    names = parser.parse_args(argv).dtypes.split(",")
    unknown = [n for n in names if n not in DTYPES]
    if unknown:
        parser.error(f"unknown dtype(s) {unknown}; expected some of {', '.join(DTYPES)}")
    print(json.dumps(dict(triton=triton.__version__)), flush=True)
    driver.set_active(_Sm90WithoutDevice())
    JITFunction._do_compile = _compile_only
    exercise_every_op(tuple(DTYPES[n] for n in names))


if __name__ == "__main__":
    main()
