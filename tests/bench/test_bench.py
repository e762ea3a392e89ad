"""The benchmark harness writes one tidy CSV per run and the plot reads only that CSV."""
import csv

import pytest
import torch

from specdec import SpecConfig
from specdec.bench.cases import WorkerCase
from specdec.bench.common import columns
from specdec.bench.report.figures import load_results
from specdec.bench.report.plots import plot_acceptance_and_speedup
from specdec.bench.suites.acceptance import AcceptanceRow, run_benchmark
from specdec.models import random_eagle3_head
from tests.helpers import near_bigram_target, perfect_eagle, perfect_mtp


def test_benchmark_csv_schema_and_plot(tmp_path):
    target = near_bigram_target(seed=1, mix=0.2)
    drafts = {"eagle": perfect_eagle(target), "mtp": perfect_mtp(target, 2, False)}
    cases = [WorkerCase("target-only", None), WorkerCase("eagle", SpecConfig(2, 2, 4)),
             WorkerCase("mtp", SpecConfig(2))]
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9]]
    target.save_pretrained(tmp_path / "target")
    cases += [WorkerCase("hf-target-only", None), WorkerCase("hf-prompt-lookup", None, 3)]
    path = run_benchmark(target, drafts, cases, prompts, [1, 2], [0.0, 0.8], 6, "tiny", out_dir=tmp_path,
                         progress=lambda s: None, peer_dir=tmp_path / "target", repeats=2)
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0].keys()) == columns(AcceptanceRow)
    assert {r["suite"] for r in rows} == {"acceptance"}
    assert [r["label"] for r in rows[:3]] == ["target-only", "EAGLE tree S2 K2 W4", "MTP MiMo S2"]
    peers = [r for r in rows if r["impl"] == "transformers"]
    rows = [r for r in rows if r["impl"] != "transformers"]
    assert len(rows) == 3 * 2 * 2
    # transformers' generate decodes the same greedy tokens from the same directory; prompt lookup at B=1 only
    assert [(r["worker"], r["batch_size"]) for r in peers] == [("hf-target-only", "1"), ("hf-prompt-lookup", "1"),
                                                               ("hf-target-only", "2")]
    assert all(r["same_tokens_as_target_only"] == "True" for r in peers)
    assert all(float(r["cpu_speedup_vs_hf_target_only"]) > 0 for r in rows if float(r["temperature"]) == 0)
    for r in rows + peers:
        assert float(r["tokens_per_s_p20"]) <= float(r["tokens_per_s"]) <= float(r["tokens_per_s_p80"])
        passes = [float(x) for x in r["cpu_tokens_per_s_by_pass"].split(";")]
        assert len(passes) == 2 and float(r["cpu_tokens_per_s"]) in passes  # the median pass is one of them
    greedy = [r for r in rows if float(r["temperature"]) == 0.0]
    assert all(r["same_tokens_as_target_only"] == "True" for r in greedy)
    assert all(float(r["max_logprob_diff"]) <= 1e-4 for r in greedy)
    assert all(float(r["speedup_vs_target_only"]) == 1.0 for r in rows if r["worker"] == "target-only")
    assert all(float(r["step_cost_in_target_only_steps"]) == 1.0 for r in rows if r["worker"] == "target-only")
    # a timing, so only its form is checked here: a machine this loaded can time a tiny step either way
    assert all(0 < float(r["step_cost_in_target_only_steps"]) < float("inf") for r in rows)
    assert all(r["step_cost_in_target_only_steps"] == "" for r in peers)
    assert all(float(r["mean_accept_len"]) > 1.0 for r in greedy if r["worker"] != "target-only")
    # the bound: accepted tokens per step over the step's model forwards, in target-only forwards
    for r in rows:
        if r["worker"] == "target-only":
            assert float(r["forward_cost_in_target_only_steps"]) == float(r["speedup_bound"]) == 1.0
        else:
            cost, acc = float(r["forward_cost_in_target_only_steps"]), float(r["mean_accept_len"])
            assert 0 < cost < float("inf") and abs(float(r["speedup_bound"]) - acc / cost) <= 1e-3 * acc / cost
        assert r["cpu_model"] and r["linear_backend"].startswith("auto")
    assert all(r["linear_backend"] == r["speedup_bound"] == "" and r["cpu_model"] for r in peers)
    # per batch of prompts: the median pass's tokens and accepted lengths, every pass's CPU seconds
    for r in rows + peers:
        batches = 4 // int(r["batch_size"])
        tokens = [int(x) for x in r["tokens_by_batch"].split(",")]
        cpu = [[float(x) for x in p.split(",")] for p in r["cpu_s_by_batch"].split(";")]
        assert len(tokens) == batches and sum(tokens) == int(r["tokens"])
        assert len(cpu) == 2 and all(len(p) == batches for p in cpu)
        assert min(abs(sum(p) - float(r["cpu_s"])) for p in cpu) <= 1e-3  # the median pass is one of them
        if r in peers:
            assert r["accept_len_by_batch"] == r["verify_steps_by_batch"] == ""
        else:  # pooled over the batches' verify steps, the row's mean accepted length
            accept = [float(x) for x in r["accept_len_by_batch"].split(",")]
            steps = [int(x) for x in r["verify_steps_by_batch"].split(",")]
            assert abs(sum(a * n for a, n in zip(accept, steps)) / sum(steps) - float(r["mean_accept_len"])) < 1e-3
    png = plot_acceptance_and_speedup(load_results(tmp_path), tmp_path / "plot.png")
    assert png.stat().st_size > 10_000


def test_kernel_benchmark_csv_schema_and_plot(tmp_path):
    """The kernel suite on a corner of the sweep: one CSV in the documented schema, and its plot."""
    import torch

    from specdec.bench.report.plots import plot_kernels
    from specdec.bench.suites.kernels import KernelRow, run_kernel_benchmark

    path = run_kernel_benchmark("cpu", impls=("reference", "fast"), batch_sizes=(1, 2), num_slots=(2,),
                                vocab_sizes=(300, 1001), dtypes=(torch.float32,), top_logprobs_nums=(0, 3),
                                repeats=3, out_dir=tmp_path, progress=lambda s: None)
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0].keys()) == columns(KernelRow)
    assert {r["impl"] for r in rows} == {"reference"}  # no CUDA: interpreted fast rows are never recorded
    ops = {r["op"] for r in rows}
    assert {"compute_spec_v2_logprobs", "build_tree_kernel_efficient", "verify_tree_greedy",
            "tree_speculative_sampling_target_only", "commit_kv_cache", "apply_penalties_tree"} <= ops
    lp = [r for r in rows if r["op"] == "compute_spec_v2_logprobs"]
    assert len(lp) == 2 * 2 * 2
    for r in rows:
        assert float(r["p20_us"]) <= float(r["median_us"]) <= float(r["p80_us"])
        assert float(r["copy_gbps"]) > 0 and r["timer"] == "process_cpu_time"
    png = plot_kernels(load_results(tmp_path), tmp_path / "kernels.png")
    assert png.stat().st_size > 10_000


def test_e2e_benchmark_csv_schema_phases_and_plot(tmp_path, monkeypatch):
    """The e2e suite on tiny random models: one CSV in the documented schema, phase times per step that
    add up to at most the step, tokens equal to the reference's, and the plot."""
    from specdec.bench.report.plots import plot_e2e
    from specdec.bench.suites import e2e as bench_e2e

    target = near_bigram_target(seed=1, mix=0.2)
    drafts = {"eagle": perfect_eagle(target), "eagle3": random_eagle3_head(target, draft_vocab_size=40, seed=2),
              "mtp": perfect_mtp(target, 3, False)}
    tiny = bench_e2e.E2EModel("tiny", target, drafts, [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3]])
    monkeypatch.setattr(bench_e2e, "shipped_model", lambda *a, **k: tiny)
    path = bench_e2e.run_e2e_benchmark("cpu", batch_sizes=(1, 2), max_new_tokens=8, prompt_len=4, repeats=2,
                                       out_dir=tmp_path, progress=lambda s: None)
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0].keys()) == columns(bench_e2e.E2ERow)
    assert len(rows) == 5 * 2 and {r["impl"] for r in rows} == {"reference"}
    assert {(r["worker"], r["label"]) for r in rows} == {
        ("target-only", "target-only"), ("eagle", "EAGLE tree S5 K4 W16"), ("eagle", "EAGLE chain S3"),
        ("eagle3", "EAGLE-3 tree S5 K4 W16"), ("mtp", "MTP MiMo S3")}
    for r in rows:
        assert r["same_tokens_as_reference"] == "True"
        phases = [float(r[f"{p}_ms"]) for p in bench_e2e.PHASES if r[f"{p}_ms"]]
        assert phases and sum(phases) <= float(r["step_ms"]) * 1.05
        if r["worker"] != "target-only":
            assert float(r["draft_extend_ms"]) > 0
        if r["worker"] not in ("target-only", "eagle3"):  # a random EAGLE-3 head rarely hits
            assert float(r["mean_accept_len"]) > 1
    png = plot_e2e(load_results(tmp_path), tmp_path / "e2e.png")
    assert png.stat().st_size > 10_000


def test_kernel_launches_alone_compute_the_op_on_rotated_copies():
    """The kernel suite's launch-alone rows time `logprob_launches`: each call must be the op's own kernel
    work (its logprobs equal the float64 log-softmax) on its own copy of the logits."""
    import torch

    from specdec.bench.suites.kernels import logprob_case, rotation_copies, time_rotated

    case = logprob_case(2, 2, 300, torch.float32, 5, torch.device("cpu"), torch.Generator().manual_seed(0))
    calls = case.launches(3)
    inputs = [c.args[0] for c in calls]
    assert len({x.data_ptr() for x in inputs}) == 3 and all(torch.equal(x, inputs[0]) for x in inputs)
    lp, top_val, top_idx, _, _ = calls[1]()
    temps = calls[1].args[3]
    predict = calls[1].args[1]
    want = torch.log_softmax(inputs[0].double() / temps.double().repeat_interleave(2)[:, None], -1)
    torch.testing.assert_close(lp.double(), want[torch.arange(4), predict.long()], rtol=0, atol=1e-5)
    torch.testing.assert_close(top_val.double(), want.topk(8, -1).values, rtol=0, atol=1e-5)
    ran = []
    times = time_rotated([lambda i=i: ran.append(i) for i in range(3)], "cpu", 7)
    assert len(times) == 7 and ran == [0, 1, 2, 0, 1, 2, 0]
    assert rotation_copies("cpu", 10) == 1


def test_draft_step_cost_is_a_ratio_of_two_measured_costs():
    from specdec.bench.suites.acceptance import draft_step_cost
    target = near_bigram_target(seed=1, mix=0.2)
    cost = draft_step_cost(target, perfect_eagle(target), [[1, 2, 3], [4, 5]], max_new_tokens=8, num_steps=3,
                           repeats=1)
    assert cost["threads"] == torch.get_num_threads()
    assert cost["target_only_step_ms"] > 0 and cost["eagle_draft_forward_ms"] > 0
    ratio = cost["eagle_draft_forward_ms"] / cost["target_only_step_ms"]
    assert abs(cost["draft_forward_in_target_only_steps"] - ratio) <= 1e-3 * ratio + 1e-4


def test_the_grammar_benchmark_rows():
    pytest.importorskip("xgrammar")
    from specdec import zoo
    from specdec.bench.cases import CASES
    from specdec.bench.common import Run
    from specdec.bench.suites.grammar import fill_rows, grammar_rows
    bundle = zoo.load(zoo.SMALL_NAME)
    run = Run("grammar", "cpu")
    rows = grammar_rows(run, bundle, zoo.SMALL_NAME, 12, 1, cases=[c for c in CASES if c.kind in ("target-only",
                                                                                                   "mtp")])
    assert [(r.label, r.grammar, r.draft_grammar) for r in rows] == [
        ("target-only", "none", False), ("target-only", "json", False), ("MTP MiMo S3", "none", False),
        ("MTP MiMo S3", "json", False), ("MTP MiMo S3", "json", True)]
    assert all(r.fill_ms_per_step > 0 for r in rows if r.grammar == "json")
    assert all(r.relative_tokens_per_s == 1.0 for r in rows if r.grammar == "none")
    fills = fill_rows(run, bundle, zoo.SMALL_NAME, 12)
    assert len(fills) == 3 and all(f.us_per_node > 0 and f.trees > 0 for f in fills)


def test_dflash_scaling_rows(tmp_path):
    """Each variant changes one setting of the shipped stage; its row's expected accepted length is 1 + the sum of the
    prefix-acceptance column, and every fraction is one per block position."""
    import json

    from specdec.bench.suites.dflash_scaling import DFlashScalingRow, main
    assert main(["--model", "stdlib-byte-6l", "--variants", "block 4", "--step-scale", "0.005", "--batch-size", "1",
                 "--eval-windows", "2", "--eval-len", "48", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("dflash-scaling-*.csv")
    (row,) = list(csv.DictReader(path.open()))
    assert list(row) == columns(DFlashScalingRow)
    assert (row["variant"], row["block_size"], row["num_layers"], row["steps"]) == ("block 4", "4", "2", "2")
    agree, prefix = json.loads(row["agreement_by_position"]), json.loads(row["accept_prefix_by_position"])
    assert len(agree) == len(prefix) == 3
    assert all(0 <= p <= a <= 1 for p, a in zip(prefix, agree)) and prefix == sorted(prefix, reverse=True)
    assert float(row["expected_tokens_per_step"]) == pytest.approx(1 + sum(prefix), abs=1e-3)
    assert float(row["block_forward_in_target_steps"]) > 0


def test_target_step_times_trees_and_transformers(tmp_path):
    """Each tree, and transformers' generate with --transformers, gets one row per round with a positive step time."""
    from pathlib import Path

    from specdec.bench.suites.target_step import TRANSFORMERS, main
    tree = str(Path(__file__).resolve().parents[2])
    assert main(["--trees", tree, "--labels", "this", "--model", "stdlib-byte-6l", "--transformers", "--rounds", "1",
                 "--prompts", "1", "--tokens", "6", "--repeats", "1", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("target-step-*.csv")
    rows = list(csv.DictReader(path.open()))
    assert [r["tree"] for r in rows] == ["this", TRANSFORMERS]
    assert all(float(r["decode_step_ms"]) > 0 and r["worker"] == "target-only" for r in rows)


def test_target_step_times_a_speculative_workers_step_and_refuses_a_bad_shape(tmp_path):
    """With --draft and --spec the tree's rows time that worker's decode step; a shape SpecConfig refuses, or a
    --draft without --spec, stops before any tree runs."""
    from pathlib import Path

    from specdec.bench.suites.target_step import main
    tree = str(Path(__file__).resolve().parents[2])
    assert main(["--trees", tree, "--labels", "this", "--model", "stdlib-byte-6l", "--draft", "eagle", "--spec",
                 "2,2,4", "--rounds", "1", "--prompts", "1", "--tokens", "32", "--repeats", "3",
                 "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("target-step-*.csv")
    (row,) = list(csv.DictReader(path.open()))
    assert row["worker"] == "eagle S2 K2 W4" and float(row["decode_step_ms"]) > 0
    with pytest.raises(ValueError, match="num_draft_tokens=9"):
        main(["--trees", tree, "--draft", "eagle", "--spec", "2,2,9", "--out", str(tmp_path / "bad")])
    for bad in (["--draft", "eagle"], ["--draft", "eagle", "--spec", "2,2"]):
        with pytest.raises(SystemExit):
            main(["--trees", tree, *bad, "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()


def test_heads_bench_compares_a_swapped_head(capsys):
    """`specdec.bench.suites.heads` runs each head and a head swapped in from a pair directory, checks each against
    target-only, and rejects a malformed shape before any compute."""
    import json

    from specdec import zoo
    from specdec.bench.suites.heads import main, parse_shape

    shipped = zoo.WEIGHTS_DIR / zoo.SMALL_NAME
    assert main(["--model", zoo.SMALL_NAME, "--kinds", "eagle", "--swap", f"eagle={shipped}", "--shapes", "2;2,2,4",
                 "--num-prompts", "2", "--prompt-len", "32", "--max-new-tokens", "12"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["rows"]
    assert [(r["draft"], r["num_draft_tokens"]) for r in rows] == [
        ("eagle", 3), ("eagle", 4), (f"eagle@{shipped}", 3), (f"eagle@{shipped}", 4)]
    assert all(r["identical"] and r["tokens_per_step"] >= 1 for r in rows)
    # the same weights from the shipped directory accept exactly as the loaded head does
    assert [r["tokens_per_step"] for r in rows[:2]] == [r["tokens_per_step"] for r in rows[2:]]
    assert [(p["draft"], p["num_draft_tokens"], p["ratio"], p["low"], p["high"]) for p in out["paired"]] == [
        (f"eagle@{shipped}", 3, 1.0, 1.0, 1.0), (f"eagle@{shipped}", 4, 1.0, 1.0, 1.0)]
    with pytest.raises(ValueError, match="S or S,K,W"):
        parse_shape("5,4")
    with pytest.raises(SystemExit):
        main(["--shapes", "x"])


def test_paired_bootstrap_of_two_drafts_over_the_same_prompts():
    """The heads bench's paired comparison: exact where every prompt agrees, inside the per-prompt extremes where
    they differ (with equal tokens, a pooled ratio of steps is a mediant of the prompts' ratios), narrower by about
    the square root of the prompt count when the prompts repeat, and a ValueError for unpaired counts."""
    import random

    from specdec.bench.suites.heads import paired_bootstrap

    tokens = [96] * 8
    steps_a = [20, 25, 31, 40, 22, 28, 35, 19]
    scaled = paired_bootstrap(tokens, steps_a, [t * 11 for t in tokens], [s * 10 for s in steps_a])
    assert scaled == {"ratio": 1.1, "low": 1.1, "high": 1.1}
    rng = random.Random(3)
    steps_b = [s + rng.choice([-3, -1, 0, 2, 4]) for s in steps_a]
    r = paired_bootstrap(tokens, steps_a, tokens, steps_b)
    per_prompt = [a / b for a, b in zip(steps_a, steps_b)]
    assert min(per_prompt) <= r["low"] <= r["ratio"] <= r["high"] <= max(per_prompt)
    assert r["ratio"] == round(sum(steps_a) / sum(steps_b), 4)
    wide = r["high"] - r["low"]
    r16 = paired_bootstrap(tokens * 16, steps_a * 16, tokens * 16, steps_b * 16)
    assert r16["ratio"] == r["ratio"] and 0.15 * wide < r16["high"] - r16["low"] < 0.4 * wide  # 1/4 expected
    with pytest.raises(ValueError, match="same prompts"):
        paired_bootstrap(tokens, steps_a, tokens[:-1], steps_b[:-1])
    with pytest.raises(ValueError, match="same prompts"):
        paired_bootstrap([], [], [], [])


def test_runners_take_turns_on_every_batch_of_a_pass():
    """The runners a bench compares alternate batch by batch within each pass, so that a slow spell of the machine
    lands on all of them rather than on one runner's whole pass; each pass sums its own batches."""
    from types import SimpleNamespace

    from specdec.bench.suites.acceptance import _measure

    calls = []

    class Runner:
        def __init__(self, name):
            self.name = name

        def generate(self, batch, params, seed=0):
            calls.append((self.name, batch[0]))
            self.last_stats = SimpleNamespace(wall_s=0.5, num_decode_steps=2, num_tokens=3)
            return [SimpleNamespace(prompt=batch[0], accept_lens=[2, 1])]

    passes = _measure([Runner("a"), Runner("b")], [["p0"], ["p1"]], None, repeats=2)
    assert calls[2:] == [("a", "p0"), ("b", "p0"), ("a", "p1"), ("b", "p1")] * 2  # after one warm-up call each
    assert [[o.prompt for o in p["outs"]] for p in passes[0]] == [["p0", "p1"]] * 2
    assert {(p["wall"], p["steps"], p["tokens"]) for r in passes for p in r} == {(1.0, 4, 6)}
    assert all(p["tokens_by_batch"] == [3, 3] and p["accept_by_batch"] == [1.5, 1.5]
               and p["verifies_by_batch"] == [2, 2] and len(p["cpu_by_batch"]) == 2 for r in passes for p in r)


def test_a_shared_ngram_case_starts_every_pass_from_an_empty_index(small, tmp_path):
    """NGRAM rows (one trie for every request, SGLang's): each pass starts from an empty trie (the warm-up and the
    passes before it leave nothing behind), so the row's accepted lengths are those of a fresh engine over the same
    prompts in order. An option's row is labelled by it."""
    from specdec import Engine, SamplingParams
    from specdec.bench.cases import NGRAM_OPTION_CASES
    from specdec.models.ngram import NgramDraft
    from specdec.zoo import corpus
    prompts = [[int(t) for t in w] for w in corpus.heldout_windows(3, 96, seed=5)]
    option = next(c for c in NGRAM_OPTION_CASES if c.spec.topk == 1 and c.draft_options == (("indexing", "sequence"),))
    case = WorkerCase("ngram", option.spec, e2e=False)
    path = run_benchmark(small.target, {"ngram": NgramDraft()}, [WorkerCase("target-only", None), case, option],
                         prompts, [1], [0.0], 32, "stdlib-byte-6l", out_dir=tmp_path, progress=lambda s: None,
                         repeats=2)
    rows = list(csv.DictReader(path.open()))
    assert [r["label"] for r in rows[1:]] == [f"NGRAM chain S{case.spec.num_steps}",
                                             f"NGRAM indexing=sequence chain S{case.spec.num_steps}"]
    assert all(r["same_tokens_as_target_only"] == "True" for r in rows[1:])
    for row, draft in zip(rows[1:], (NgramDraft(), NgramDraft(indexing="sequence"))):
        fresh = Engine(small.target, draft, case.spec)
        lens = [a for p in prompts for a in fresh.generate([p], SamplingParams(max_new_tokens=32))[0].accept_lens]
        assert float(row["mean_accept_len"]) == round(sum(lens) / len(lens), 4)


def test_the_reports_goals_compare_two_rows_pass_by_pass():
    """A goal's ratio is the median over passes of the per-pass ratio (computed here by hand), not the ratio of the
    two rows' median passes; a CSV without the per-pass column falls back to that ratio and says so."""
    import pandas as pd

    from specdec.bench.report.tables import goals_table

    def row(label, worker, B, passes):
        return dict(label=label, worker=worker, batch_size=B, temperature=0.0,
                    cpu_tokens_per_s=sorted(passes)[1], cpu_tokens_per_s_by_pass=";".join(map(str, passes)))
    # pass 2 ran in a slow spell for both: paired ratios 1.1, 1.1, 0.9 -> 1.1; medians 110 / 100 -> 1.1 would hide
    # nothing here, so the base's passes are ordered to make the two estimates differ
    df = pd.DataFrame([row("target-only", "target-only", 16, [100.0, 50.0, 120.0]),
                       row("NGRAM tuned", "ngram", 16, [110.0, 55.0, 108.0]),
                       row("transformers target-only", "hf-target-only", 1, [40.0, 20.0, 44.0]),
                       row("EAGLE tuned", "eagle", 1, [100.0, 52.0, 110.0]),
                       row("EAGLE chain S3", "eagle", 1, [90.0, 60.0, 80.0])])
    table = goals_table(df)
    ngram = next(line for line in table.splitlines() if "NGRAM tuned / specdec's target-only, B = 16" in line)
    assert "| 1.10x | 0.90-1.10, 2 of 3 |" in ngram and ngram.endswith("| yes |")  # median(1.1, 1.1, 0.9)
    # (the medians' ratio would be 108 / 100 = 1.08)
    best = next(line for line in table.splitlines() if line.startswith("| best worker"))
    # EAGLE tuned: 2.5, 2.6, 2.5 -> 2.5; the chain: 2.25, 3.0, 1.82 -> 2.25
    assert "| 2.50x (EAGLE tuned) |" in best and best.endswith("| yes |")
    assert not any("prompt lookup" in line for line in table.splitlines())  # rows the CSV lacks: no goal line
    old = goals_table(df.drop(columns="cpu_tokens_per_s_by_pass"))
    assert "1.08x (median passes) |  |" in old


def test_standalone_against_trained_heads_where_it_accepts_more():
    """The comparison on the prompts where STANDALONE accepts more per step than a worker with a trained head:
    the tuned STANDALONE row against every such row, and the STANDALONE row of the same shape; tokens per CPU second
    on those prompts only, pass by pass (computed here by hand), and a row with no such prompt says so."""
    import pandas as pd

    from specdec.bench.report.tables import accepts_more_table, where_it_accepts_more

    def row(label, worker, policy, shape, accept, cpu):  # 10 tokens per prompt, in 10 / accept verify steps
        return dict(label=label, worker=worker, shape_policy=policy, batch_size=1, temperature=0.0,
                    num_steps=shape[0], topk=shape[1], num_draft_tokens=shape[2], tokens_by_batch="10,10,10,10",
                    accept_len_by_batch=",".join(map(str, accept)),
                    verify_steps_by_batch=",".join(str(10 / a) for a in accept),
                    cpu_s_by_batch=";".join(",".join(map(str, p)) for p in cpu))
    tuned = row("STANDALONE tuned", "draft_lm", "tuned", (4, 4, 16), [2.0, 3.0, 1.5, 4.0], [[1, 1, 1, 1], [2, 2, 2, 2]])
    tree = row("STANDALONE tree S5 K4 W16", "draft_lm", "static", (5, 4, 16), [2.0, 2.0, 2.0, 2.0],
               [[1, 1, 1, 1]] * 2)
    eagle = row("EAGLE tree S5 K4 W16", "eagle", "static", (5, 4, 16), [2.5, 2.0, 1.0, 5.0],
                [[2, 1, 4, 1], [2, 2, 2, 2]])
    mtp = row("MTP MiMo S3", "mtp", "static", (3, 1, 4), [5.0, 5.0, 5.0, 5.0], [[1, 1, 1, 1]] * 2)
    ngram = row("NGRAM tuned", "ngram", "tuned", (7, 4, 12), [1.0] * 4, [[1, 1, 1, 1]] * 2)
    old = dict(mtp, label="MTP chain S3", worker="mtp_chain", tokens_by_batch="")  # a CSV before these columns
    df = pd.DataFrame([tuned, tree, eagle, mtp, ngram, old])
    # prompts 1 and 2: pass 1 20 / 2 against 20 / 5 -> 2.5, pass 2 20 / 4 against 20 / 4 -> 1.0; median 1.75
    r = where_it_accepts_more(df.iloc[0], df.iloc[2])
    assert (r["more"], r["of"], r["passes"], r["ratio"]) == (2, 4, [2.5, 1.0], 1.75)
    assert abs(r["accept_a"] - 20 / (10 / 3 + 10 / 1.5)) < 1e-9 and abs(r["accept_b"] - 20 / 15) < 1e-9
    table = accepts_more_table(df).splitlines()
    assert table[2:] == [
        "| EAGLE tree S5 K4 W16 | STANDALONE tuned | 2 of 4 | 2.00 / 1.33 | 1.75x (1.00-2.50) | yes |",
        # the same shape: prompt 2 only (2.0 > 1.0), 10 / 1 against 10 / 4 in pass 1, 10 / 1 against 10 / 2 in pass 2
        "| EAGLE tree S5 K4 W16 | STANDALONE tree S5 K4 W16 | 1 of 4 | 2.00 / 1.00 | 3.00x (2.00-4.00) | yes |",
        "| MTP MiMo S3 | STANDALONE tuned | 0 of 4 |  |  |  |"]  # NGRAM needs no trained head; the old row: no data
    assert accepts_more_table(df.drop(columns="cpu_s_by_batch").assign(cpu_s_by_batch="")) == ""


def test_each_verify_rule_runs_on_the_shapes_it_verifies():
    """`--verify`: block on chains, traversal on trees, rejection on both; NGRAM and target-only only as they are;
    each rule's row label names the rule, and the table finds the target-only row of the same shape from it."""
    from specdec.bench.cases import with_verify_rules
    from specdec.bench.suites.verify_rules import base_label, rule_of
    cases = [WorkerCase("target-only", None), WorkerCase("eagle", SpecConfig(5, 4, 16)),
             WorkerCase("eagle", SpecConfig(3)), WorkerCase("ngram", SpecConfig(3))]
    out = with_verify_rules(cases, ["target_only", "rejection", "block", "traversal"])
    specs = [(c.kind, c.spec and (c.spec.topk, c.spec.verify, c.spec.draft_sampling)) for c in out]
    assert specs == [("target-only", None),
                     ("eagle", (4, "target_only", "topk")), ("eagle", (4, "rejection", "sample")),
                     ("eagle", (4, "traversal", "sample")),
                     ("eagle", (1, "target_only", "topk")), ("eagle", (1, "rejection", "sample")),
                     ("eagle", (1, "block", "sample")),
                     ("ngram", (1, "target_only", "topk"))]
    assert [(base_label(x), rule_of(x)) for x in ("EAGLE tree S5 K4 W16 traversal", "EAGLE chain S3 block",
                                                  "EAGLE chain S3")] == [
        ("EAGLE tree S5 K4 W16", "traversal"), ("EAGLE chain S3", "block"), ("EAGLE chain S3", "target_only")]


def test_check_prompts_limits_the_untimed_passes_to_the_first_batches(tmp_path):
    from specdec.bench.suites.acceptance import check_batches, planned_decodes
    assert list(check_batches(4, 2, 3)) == [0, 1] and list(check_batches(4, 1, 1)) == [0]
    assert list(check_batches(4, 2, None)) == [0, 1, 2, 3] and list(check_batches(2, 8, 100)) == [0, 1]
    cases = [WorkerCase("target-only", None), WorkerCase("eagle", SpecConfig(2, 2, 4)),
             WorkerCase("hf-target-only", None)]
    # 3 cases x 4 batches timed once, then 2 engines x (logprob + phase pass) x 1 batch
    assert planned_decodes(cases, 4, [1], [0.0], 1, check_prompts=1) == {1: 3 * 4 + 2 * 2 * 1}
    target = near_bigram_target(seed=1, mix=0.2)
    path = run_benchmark(target, {"eagle": perfect_eagle(target)}, cases[:2], [[1, 2, 3], [4, 5], [6], [7, 8]],
                         [1], [0.0], 6, "tiny", out_dir=tmp_path, progress=lambda s: None, repeats=1,
                         check_prompts=1, show_progress=False)
    rows = list(csv.DictReader(path.open()))
    assert [r["same_tokens_as_target_only"] for r in rows] == ["True", "True"]
    assert rows[1]["max_logprob_diff"] != "" and rows[1]["draft_ms_per_step"] != ""


def test_a_kind_and_a_rule_registered_from_outside_run_through_the_bench(tmp_path):
    """A draft LM of a kind of its own and Medusa's typical acceptance, both registered as a notebook would: the
    acceptance suite measures them beside target-only, each row labelled by the kind's label and the rule's name."""
    import specdec
    from specdec.bench.cases import with_verify_rules
    from specdec.draft_kinds import draft_lm_kv_margin, tree_shape_label, unregister
    from specdec.models.llama import LlamaForCausalLM
    from specdec.verify_rules import unregister as unregister_rule
    from specdec.workers.standalone import StandaloneWorker
    from tests.helpers.rules import TYPICAL

    class PluginDraft(LlamaForCausalLM):
        """A draft LM of its own kind."""

    target = near_bigram_target(seed=1, mix=0.2, vocab_size=16)
    source = near_bigram_target(seed=2, mix=0.2, vocab_size=16)
    draft = PluginDraft(source.config)
    draft.load_state_dict(source.state_dict())
    specdec.register_draft_kind(name="plugin_lm", label="Plugin LM", model=PluginDraft, worker=StandaloneWorker,
                                kv_margin=draft_lm_kv_margin, shape_label=tree_shape_label)
    specdec.register_verify_rule(**TYPICAL)
    try:
        cases = with_verify_rules([WorkerCase("target-only", None), WorkerCase("plugin_lm", SpecConfig(2, 1))],
                                  ["target_only", "typical"])
        path = run_benchmark(target, {"plugin_lm": draft}, cases, [[1, 2, 3]], [1], [1.0], 3, "tiny",
                             out_dir=tmp_path, progress=lambda s: None, repeats=1, show_progress=False)
    finally:
        unregister("plugin_lm")
        unregister_rule("typical")
    rows = {r["label"]: r for r in csv.DictReader(path.open())}
    assert list(rows) == ["target-only", "Plugin LM chain S2", "Plugin LM chain S2 typical"]
    assert rows["Plugin LM chain S2"]["worker"] == "plugin_lm"
    assert rows["Plugin LM chain S2 typical"]["verify"] == "typical"
    assert all(float(r["mean_accept_len"]) >= 1 for r in rows.values())


def test_dspark_rows_with_and_without_the_confidence_cap(tmp_path):
    """`specdec bench --workers dspark`: the capped block and the whole block (`DSPARK_OPTION_CASES`, the drafter's
    threshold set to 0 on a copy) are two rows of one drafter, both token-identical to target-only, and no rule
    inexact on a stopped chain (block verification) is run with the capped one."""
    from specdec.bench.cases import DSPARK_OPTION_CASES, with_dspark_thresholds, with_verify_rules
    from specdec.models import random_llama
    from specdec.models.dspark import random_dspark
    target = random_llama(vocab_size=12, hidden_size=32, num_hidden_layers=4, seed=11)
    draft = random_dspark(target, 2, 7, target_layer_ids=[-1, 2], mask_token_id=11, seed=5, std=0.5, markov_rank=8,
                          confidence_threshold=0.5)
    capped, whole = WorkerCase("dspark", SpecConfig(7), e2e=False), DSPARK_OPTION_CASES[0]
    assert whole.draft_for(draft).confidence_threshold == 0.0 and draft.confidence_threshold == 0.5
    assert [c.spec and c.spec.verify for c in with_verify_rules([capped], ["target_only", "block", "rejection"])] == [
        "target_only", "rejection"]
    path = run_benchmark(target, {"dspark": draft}, [WorkerCase("target-only", None), capped, whole],
                         [[1, 2, 3, 4]], [1], [0.0], 8, "tiny", out_dir=tmp_path,
                         progress=lambda s: None, repeats=1)
    rows = list(csv.DictReader(path.open()))
    assert [r["label"] for r in rows[1:]] == ["DSpark block 7", "DSpark confidence_threshold=0.0 block 7"]
    # `--confidence-thresholds 0.3,0`: a row per threshold in place of DSpark's, each on a copy of the same drafter
    ngram = WorkerCase("ngram", SpecConfig(3))
    swept = with_dspark_thresholds([WorkerCase("target-only", None), capped, whole, ngram], [0.3, 0.0])
    assert [c.label for c in swept] == ["target-only", "DSpark confidence_threshold=0.3 block 7", whole.label,
                                        ngram.label]
    assert with_dspark_thresholds([ngram], [0.3]) == [ngram] and with_dspark_thresholds([capped], []) == [capped]
    swept = swept[1:3]
    assert [c.draft_for(draft).confidence_threshold for c in swept] == [0.3, 0.0] and draft.confidence_threshold == 0.5
    assert all(r["same_tokens_as_target_only"] == "True" for r in rows[1:])
