"""What `specdec gpu-check` holds decode against: the bytes one decode step must read (`gpu_roofline`, counted here
by hand on a tiny model), the fraction of the read ceiling a measured step reaches, the engines part's plan, its
configurations' own processes, and the SUMMARY.md sections that show them."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from specdec.gpu_check import engines as gpu_engines, roofline as gpu_roofline, rows as gpu_rows
from specdec.gpu_check import summary as gpu_summary
from specdec.gpu_check.rows import E2E, KERNELS
from specdec.models import random_llama
from tests.helpers import write_gpu_rows

#: random_llama(vocab 64, hidden 32, MLP 64, 2 layers, 4 heads of 8, 2 KV heads), fp32, counted by hand: per layer
#: two norms (2 x 32), q 32 x 32, k and v 32 x 16 each, o 32 x 32, gate and up 32 x 64 each, down 64 x 32; then the
#: final norm (32) and the 64 x 32 LM head. The 64 x 32 input embedding is gathered, not read (untied).
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)
LAYER = 2 * 32 + 32 * 32 + 2 * 32 * 16 + 32 * 32 + 2 * 32 * 64 + 64 * 32
WEIGHT_BYTES = 4 * (2 * LAYER + 32 + 64 * 32)
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 8 * 4  # k and v, 2 layers, 2 KV heads, head_dim 8, fp32


@pytest.mark.parametrize("tied", [False, True])
def test_a_target_only_step_reads_its_weights_once_and_the_kv_cache_at_its_context(tied):
    model = random_llama(**TINY, tie_word_embeddings=tied)
    reads = gpu_roofline.target_reads(model)
    assert WEIGHT_BYTES == 82560
    assert reads.target_weights == WEIGHT_BYTES  # tied: the embedding is the head, counted once
    assert reads.target_kv_per_token == KV_BYTES_PER_TOKEN == 256
    assert reads.bytes(batch_size=3, context_len=10) == WEIGHT_BYTES + 3 * 10 * 256
    assert gpu_roofline.min_step_bytes(WEIGHT_BYTES, 256, 3, 10) == 82560 + 7680


def test_a_draft_adds_its_weights_and_its_cache_once_per_forward():
    # bytes = W_t + B L KV_t + F (W_d + B L KV_d)
    assert gpu_roofline.min_step_bytes(1000, 10, batch_size=2, context_len=5, draft_weights=300, draft_forwards=4,
                                       draft_kv_per_token=3) == 1000 + 2 * 5 * 10 + 4 * (300 + 2 * 5 * 3)


def _worker(kind: str, spec):
    from specdec import Engine
    from specdec.draft_kinds import DRAFT_KINDS
    target = random_llama(**TINY)
    draft = DRAFT_KINDS[kind].new_random_draft(target)
    return Engine(target, draft, spec, impl="reference", max_batch=2, max_seq_len=64).worker, target, draft


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def test_each_draft_kind_reads_as_its_worker_runs_it():
    from specdec import SpecConfig
    # EAGLE: S forwards of its layer, each also reading the target's LM head (the head owns none)
    worker, target, draft = _worker("eagle", SpecConfig(3, 2, 6))
    reads = gpu_roofline.step_reads(worker)
    head = _bytes(target.lm_head.weight)
    assert (reads.draft_forwards, reads.draft_weights) == (3, gpu_roofline.forward_weight_bytes(draft) + head)
    assert reads.draft_kv_per_token == KV_BYTES_PER_TOKEN // 2  # one layer
    # MTP: each of the S layers once, and the target's head after each
    worker, target, draft = _worker("mtp", SpecConfig(3))
    reads = gpu_roofline.step_reads(worker)
    per_layer = gpu_roofline.forward_weight_bytes(draft) / len(draft.layers)
    assert reads.draft_forwards == 3 and reads.draft_weights == round(per_layer + head)
    # STANDALONE: S forwards of a draft LM with its own head (its embedding gathered)
    worker, target, draft = _worker("draft_lm", SpecConfig(2))
    reads = gpu_roofline.step_reads(worker)
    assert (reads.draft_forwards, reads.draft_weights) == (2, gpu_roofline.forward_weight_bytes(draft))
    assert gpu_roofline.forward_weight_bytes(draft) < sum(_bytes(p) for p in draft.parameters())
    # NGRAM: no forward of its own
    worker, target, _ = _worker("ngram", SpecConfig(2))
    assert gpu_roofline.step_reads(worker) == gpu_roofline.target_reads(target)


@pytest.mark.parametrize("kind", ["eagle", "draft_lm"])
def test_a_token_maps_head_replaces_the_full_head_a_draft_reads(kind):
    """With a token map of n ids the draft's logits read n rows of H, not the V rows of the head it would read."""
    from specdec import Engine, SpecConfig
    from specdec.draft_kinds import DRAFT_KINDS
    target = random_llama(**TINY)
    draft = DRAFT_KINDS[kind].new_random_draft(target)
    full = gpu_roofline.step_reads(Engine(target, draft, SpecConfig(3, 2, 6), max_seq_len=64).worker)
    hot = gpu_roofline.step_reads(Engine(target, draft, SpecConfig(3, 2, 6), max_seq_len=64,
                                         token_map=list(range(10))).worker)
    head = target.lm_head.weight if kind == "eagle" else draft.lm_head.weight
    assert full.draft_weights - hot.draft_weights == _bytes(head) * (64 - 10) // 64
    assert (hot.draft_forwards, hot.draft_kv_per_token) == (full.draft_forwards, full.draft_kv_per_token)


def test_the_e2e_part_runs_the_eagle_tree_with_a_hot_vocabulary_on_graphs():
    from specdec.gpu_check.decode import HOT_VOCAB, e2e_plan
    hot = [(B, impl, graphs) for B, case, impl, graphs in e2e_plan(smoke=False) if case.token_map_size]
    assert hot == [(32, "fast", True), (1, "fast", True)]
    assert any(c.label == f"EAGLE tree S5 K4 W16 hot {HOT_VOCAB}" for _, c, _, _ in e2e_plan(smoke=True))


def test_every_e2e_worker_has_a_bytes_rule():
    from specdec.gpu_check.decode import E2E_KINDS, e2e_cases
    from specdec.draft_kinds import DRAFT_KINDS
    ruled = {k.name for k in DRAFT_KINDS.values() if k.forwards_per_step is not None}
    assert set(E2E_KINDS) <= ruled and {c.kind for c in e2e_cases() if c.spec is not None} <= ruled


def test_the_roofline_columns():
    fields = gpu_roofline.roofline_fields(2e9, 0.002, 2000.0, 96.0)
    assert fields["step_us"] == pytest.approx(2000.0) and fields["read_gbps"] == pytest.approx(1000.0)
    assert fields["frac_of_read_ceiling"] == pytest.approx(0.5) and fields["context_len"] == 96.0
    missing = gpu_roofline.roofline_fields("", 0.002, "", 96.0)
    assert missing["read_gbps"] == "" and missing["frac_of_read_ceiling"] == "" and missing["step_us"] != ""
    names = {f.name for f in dataclasses.fields(gpu_rows.DecodeRow)}
    assert set(gpu_roofline.blank_roofline()) <= names


def test_the_engines_plan_profiles_first_and_names_columns_its_error_rows_have(monkeypatch):
    for smoke in (False, True):
        plan = gpu_engines.engines_plan(smoke)
        assert plan[0].engine == "profile" and len({c.key for c in plan}) == len(plan)
        assert {c.batch_size for c in plan[1:]} == set(gpu_engines.SMOKE_ENGINE_SIZES if smoke else (1, 32))
    assert gpu_engines.planned_impl("transformers", False) in gpu_summary.ENGINE_NAMES
    assert gpu_engines.planned_impl("inductor", True) in gpu_summary.ENGINE_NAMES
    captured = []
    monkeypatch.setattr(gpu_engines, "run_configs", lambda part, configs, error_row: captured.extend(configs))
    gpu_engines.run_engines(Path("/nonexistent"), smoke=False)
    assert [c.key for c in captured] == [c.key for c in gpu_engines.engines_plan(False)]
    for config in captured:  # a failed configuration's row carries these: they must be columns of its file
        gpu_rows.error_row(gpu_rows.ROW_TYPES[config.file], {}, config.fields, "x")


def test_a_configuration_whose_process_fails_is_an_error_naming_why(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDEC_GPU_CHECK_PROGRESS", raising=False)
    with pytest.raises(gpu_engines.ConfigProcessFailed, match="its process died \\(exit status 2\\)"):
        gpu_engines._in_own_process(gpu_engines.EngineConfig("profile", 7), tmp_path, smoke=True)  # not in the plan


def test_only_one_token_forwards_go_through_the_compiled_target():
    class Model:
        config = "its config"

        def __call__(self, ids, *args, **kwargs):
            return ("eager", ids.shape[1])

    ran = {}
    wrapper = gpu_engines._DecodeCompiled(Model(), lambda ids, *a, **k: ("compiled", ids.shape[1]), ran)
    assert wrapper(torch.zeros(2, 7)) == ("eager", 7) and not ran  # a prefill
    assert wrapper(torch.zeros(2, 1)) == ("compiled", 1) and ran == {"compiled": True}  # a decode step
    assert wrapper.config == "its config"


def test_the_transformers_twin_holds_the_same_weights_and_decodes_the_same_tokens():
    pytest.importorskip("transformers")
    from specdec import Engine, SamplingParams
    target = random_llama(**TINY, seed=3)
    twin = gpu_engines.transformers_twin(target)
    ids = torch.randint(64, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = target(ids, torch.arange(7).expand(2, 7)).logits
        got = twin(ids).logits
    assert (got - want).abs().max() <= 1e-4
    out = twin.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6,
                        do_sample=False, cache_implementation="static", pad_token_id=0)
    ours = Engine(target, impl="reference", max_batch=2, max_seq_len=32).generate(ids.tolist(),
                                                                                SamplingParams(max_new_tokens=6))
    assert out[:, 7:].tolist() == [o.token_ids for o in ours]
    assert gpu_roofline.target_reads(twin) == gpu_roofline.target_reads(target)


# ---- the SUMMARY.md sections -----------------------------------------------------------------------------
def test_the_summary_holds_decode_against_the_read_ceiling_and_the_profiled_replay(tmp_path):
    common = dict(label="target-only", tokens_per_s=100.0, read_ceiling_gbps=4000.0)
    write_gpu_rows(tmp_path, E2E, [
        dict(common, part="e2e", impl="fast", cuda_graphs=True, batch_size=1, step_us=900.0, bytes_per_step=3e9,
             read_gbps=3333.0, frac_of_read_ceiling=0.833),
        dict(common, part="e2e", impl="fast", cuda_graphs=True, batch_size=8, frac_of_read_ceiling=0.5),
        dict(common, part="e2e", label="EAGLE tree", impl="reference", cuda_graphs=False, batch_size=1),
        dict(common, part="engines", impl="transformers_compiled", cuda_graphs=True, batch_size=1,
             frac_of_read_ceiling=0.61, note="compiled by generate"),
        dict(common, part="engines", impl="reference_inductor", cuda_graphs=False, batch_size=32,
             status="error", error="ConfigTimeout: still running after 120 s")])
    lines = gpu_summary.roofline_section(tmp_path, smoke=False)
    table = [x for x in lines if x.startswith("| 1 ") or x.startswith("| 8 ")]
    assert "read ceiling 4000 GB/s" in lines[2]
    assert table == ["| 1 | target-only | fast + graphs | 100.0 | 900 | 3000.0 | 3333 | 83% |",
                     "| 1 | target-only | transformers static cache + compile + graphs | 100.0 |  |  |  | 61% |"]
    assert "- transformers static cache + compile B=1: compiled by generate" in lines
    assert "transformers static cache + compile + graphs B=1: 100.0 tok/s (61% of the read ceiling)" in \
        gpu_summary.engines_headline(tmp_path)

    profile = dict(part="profile", check="profile", impl="fast_graph", batch_size=1, repeats=5)
    kernels = [dict(profile, timer="torch_profiler_cuda", op=f"kernel_{i}", calls=16, total_us=100.0 - i)
               for i in range(33)]
    write_gpu_rows(tmp_path, KERNELS, kernels + [dict(profile, timer="cuda_event", op="(total)", calls=528,
                                              total_us=sum(k["total_us"] for k in kernels), median_us=3700.0,
                                              p20_us=3650.0, p80_us=3800.0)])
    lines = gpu_summary.profile_section(tmp_path)
    assert lines[0] == "## Profile: one CUDA-graph replay of the fast target-only decode step, B = 1"
    rows = [x for x in lines if x.startswith("| ")][1:]
    assert len(rows) == 32 and rows[0].startswith("| 1 | `kernel_0` | 16 | 100.0 |")
    assert rows[30].startswith("|  | 3 more | 48 | 207.0 |") and rows[31].startswith("|  | **total** | 528 |")


def test_the_e2e_part_measures_target_only_reading_each_step_first_beside_decoding_ahead():
    """The pair the decoding-ahead figure comes from: target-only fast + graphs with and without it, at B = 1 and
    32, and the engine built for the read-first row does not decode ahead."""
    from specdec.gpu_check.decode import e2e_plan
    plan = e2e_plan(smoke=False)
    first = [(B, impl, graphs) for B, case, impl, graphs in plan if not case.decode_ahead]
    ahead = [(B, impl, graphs) for B, case, impl, graphs in plan if case.spec is None and case.decode_ahead]
    assert first == [(32, "fast", True), (1, "fast", True)]
    assert set(first) <= set(ahead)
    labels = {c.label for _, c, _, _ in plan if c.spec is None}
    assert labels == {"target-only", "target-only read first"}
