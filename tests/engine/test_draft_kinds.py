"""The draft-kind registry: what each shipped kind means, a kind registered at run time running end to end on an
existing worker (and, registered from outside with its classes, through the exact-law checker), and the ValueErrors of
bad records, of plugins that would change a shipped kind and of drafts no kind claims."""
import pytest
import torch

import specdec
from specdec import Engine, NgramDraft, SamplingParams, SpecConfig, draft_kinds, zoo
from specdec.bench.cases import CASES, by_kind, kind_of_label
from specdec.draft_kinds import (DRAFT_KINDS, DraftKind, draft_kind, kind_of, register, tree_kv_margin,
                                 tree_shape_label, worker_label)
from specdec.cli.generate import load_draft
from specdec.models import EagleDraftHead
from specdec.workers import EagleWorkerV2, MultiLayerEagleWorkerV2
from specdec.zoo.train import DRAFTS, EXTRA_STAGES, STAGES, default_opts
from tests.helpers import bigram_target, perfect_eagle

SHIPPED = ("eagle", "eagle3", "mtp", "mtp_chain", "ngram", "suffix", "draft_lm", "dflash", "dspark", "scripted")
#: the kinds the zoo trains and ships weights of
ZOO = ("eagle", "eagle3", "mtp", "mtp_chain", "draft_lm", "dflash")


@pytest.fixture
def registry():
    """The registry as it stands, restored after the test (a kind registered in it leaves with it)."""
    before = dict(DRAFT_KINDS)
    yield DRAFT_KINDS
    for name in [k for k in DRAFT_KINDS if k not in before]:
        draft_kinds.unregister(name)
    assert dict(DRAFT_KINDS) == before


def test_the_shipped_kinds_and_what_reads_them():
    assert tuple(DRAFT_KINDS) == SHIPPED
    assert DRAFTS == ZOO and STAGES == ("target",) + ZOO and tuple(zoo.zoo_kinds()) == ZOO
    # the demo's order, written out: the kinds side by side at each shape (MTP's S3 chain is the chain S3)
    assert [c.label for c in CASES] == [
        "target-only", "EAGLE tree S5 K4 W16", "EAGLE-3 tree S5 K4 W16", "NGRAM tree S5 K4 W16",
        "SUFFIX tree S5 K4 W16", "STANDALONE tree S5 K4 W16", "SCRIPTED tree S5 K4 W16", "EAGLE chain S3",
        "EAGLE-3 chain S3", "MTP MiMo S3", "MTP Step-3.5 S3", "NGRAM chain S3", "SUFFIX chain S3",
        "STANDALONE chain S3", "SUFFIX chain S24", "DFlash block 8", "DSpark block 7", "SCRIPTED chain S5"]
    assert [c.label for c in CASES if not c.e2e] == ["NGRAM tree S5 K4 W16", "SUFFIX tree S5 K4 W16",
                                                     "STANDALONE tree S5 K4 W16", "EAGLE-3 chain S3",
                                                     "MTP Step-3.5 S3", "SUFFIX chain S3", "SUFFIX chain S24",
                                                     "DSpark block 7"]
    assert [c.kind for c in by_kind(CASES)] == ["target-only", "eagle", "eagle", "eagle3", "eagle3", "mtp",
                                                "mtp_chain", "ngram", "ngram", "suffix", "suffix", "suffix",
                                                "draft_lm", "draft_lm", "dflash", "dspark", "scripted", "scripted"]
    assert [kind_of_label(c.label) for c in CASES] == [c.kind for c in CASES]
    opts = default_opts()
    # DSpark's stage is trained only when named: its weights do not ship yet
    assert EXTRA_STAGES == ("dspark",) and tuple(zoo.trainable_kinds()) == ZOO + EXTRA_STAGES
    assert list(opts) == list(STAGES + EXTRA_STAGES) and "draft_vocab_size" not in opts["eagle3"].extra
    opts["eagle"].extra["unroll"] = 9  # each call's settings are its own
    assert default_opts()["eagle"].extra["unroll"] == 3 == DRAFT_KINDS["eagle"].zoo.opts["extra"]["unroll"]


@pytest.mark.parametrize("kind, worker, tree_margin", [("eagle", EagleWorkerV2, 16), ("eagle3", EagleWorkerV2, 16),
                                                       ("mtp", MultiLayerEagleWorkerV2, None),
                                                       ("mtp_chain", MultiLayerEagleWorkerV2, None)])
def test_each_shipped_draft_is_its_kind(kind, worker, tree_margin, small):
    draft = getattr(small, kind)
    assert draft is small.drafts[kind] and kind_of(draft) is draft_kind(kind)
    tree, chain = SpecConfig(5, 4, 16), SpecConfig(3)
    if tree_margin is not None:  # W = 16 verify nodes > (S-1)K = 16 > S+1 = 6
        engine = Engine(small.target, draft, tree, impl="reference", max_batch=1, max_seq_len=64)
        assert type(engine.worker) is worker and engine.worker.kv_margin == tree_margin
    engine = Engine(small.target, draft, chain, impl="reference", max_batch=1, max_seq_len=64)
    # a chain of 3: EAGLE writes the S+1 = 4 of its extend, MTP's extend a window of 2S = 6
    assert type(engine.worker) is worker and engine.worker.kv_margin == (4 if tree_margin else 6)
    assert draft_kind(kind).kv_margin(chain) == engine.worker.kv_margin


@pytest.mark.parametrize("kind, spec", [("eagle", SpecConfig(5, 4, 16)), ("eagle3", SpecConfig(5, 4, 16)),
                                        ("mtp", SpecConfig(3)), ("mtp_chain", SpecConfig(3))])
def test_generate_loads_each_zoo_directory_as_its_kind(kind, spec, small):
    root = small.path
    draft, default = load_draft(small.target, root / "target", root / kind, "auto")
    assert kind_of(draft).name == kind and default == spec
    assert load_draft(small.target, root / "target", None, "auto") == (None, None)


def test_labels():
    assert worker_label("eagle", None) == "target-only"
    assert worker_label("eagle", SpecConfig(3, 1)) == "EAGLE chain S3"
    assert worker_label("eagle3", SpecConfig(4, 2, 7)) == "EAGLE-3 tree S4 K2 W7"
    assert worker_label("mtp_chain", SpecConfig(2)) == "MTP Step-3.5 S2"
    with pytest.raises(ValueError, match=r"unknown draft kind 'eagle4'; registered: eagle, eagle3, mtp, mtp_chain, "
                                         r"ngram, suffix, draft_lm, dflash, dspark, scripted"):
        worker_label("eagle4", SpecConfig(3))


def test_a_draft_no_kind_claims_is_a_value_error_naming_the_kinds():
    target = bigram_target(seed=1)
    with pytest.raises(ValueError, match=r"draft must be the model of a draft kind \(EagleDraftHead: eagle; "
                                         r"Eagle3DraftHead: eagle3; MTPDraftModel: mtp, mtp_chain; NgramDraft: "
                                         r"ngram; SuffixDraft: suffix; LlamaForCausalLM: draft_lm; DFlashDraftModel: "
                                         r"dflash; DSparkDraftModel: dspark; ScriptedDraft: scripted\), got Linear"):
        Engine(target, torch.nn.Linear(2, 2), SpecConfig(3))


class RenamedHead(EagleDraftHead):
    """An EAGLE head under a name of its own: the model of the kind registered at run time below."""

    architecture = "RenamedHead"


class CountingWorker(EagleWorkerV2):
    """EagleWorkerV2 that counts its drafts: the worker of the kind registered at run time below."""

    drafts = 0

    def draft(self):
        type(self).drafts += 1
        return super().draft()


def renamed_kind(**fields) -> DraftKind:
    return DraftKind(**{**dict(name="renamed", label="Renamed EAGLE", model=f"{__name__}:RenamedHead",
                               worker=f"{__name__}:CountingWorker", kv_margin=tree_kv_margin,
                               shape_label=tree_shape_label, demo_specs=(SpecConfig(3, 2, 6),)), **fields})


def test_a_kind_registered_at_run_time_runs_end_to_end(registry, tmp_path):
    target = bigram_target(seed=3)
    perfect = perfect_eagle(target)
    perfect.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((tmp_path / "config.json").read_text().replace('"EagleDraftHead"',
                                                                                         '"RenamedHead"'))
    head = RenamedHead(perfect.config, target)
    head.load_state_dict(perfect.state_dict())
    assert kind_of(head).name == "eagle"  # unregistered, a subclass is its base class's kind

    kind = register(renamed_kind())
    assert kind_of(head) is kind and kind_of(perfect).name == "eagle"  # the nearest class decides
    loaded = draft_kind("renamed").load(tmp_path, target)
    assert type(loaded) is RenamedHead
    spec = kind.default_spec(loaded)
    assert worker_label("renamed", spec) == "Renamed EAGLE tree S3 K2 W6"
    prompts = [[1, 2, 3], [4, 5]]
    params = SamplingParams(max_new_tokens=12)
    base = Engine(target, impl="reference", max_batch=2, max_seq_len=40).generate(prompts, params)
    engine = Engine(target, loaded, spec, impl="reference", max_batch=2, max_seq_len=40)
    assert type(engine.worker) is CountingWorker and engine.worker.kv_margin == tree_kv_margin(spec) == 6
    CountingWorker.drafts = 0
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in base]
    assert CountingWorker.drafts > 0 and engine.last_stats.mean_accept_len > 2  # a perfect draft, drafting


@pytest.mark.parametrize("fields, message", [
    (dict(name="eagle"), "draft kind 'eagle' is already registered"),
    (dict(name="target"), "must be a Python identifier other than"),
    (dict(name="eagle,4"), "must be a Python identifier other than"),
    (dict(model="tests.test_draft_kinds.RenamedHead"), "model must be 'package.module:Name'"),
    (dict(worker="specdec.workers.eagle:"), "worker must be 'package.module:Name'"),
    (dict(model="specdec.models.eagle:EagleDraftHead"), "claims the models of 'eagle'"),
    (dict(e2e_specs=(SpecConfig(2),)), "e2e_specs must be among its demo_specs"),
])
def test_register_rejects_a_bad_record(registry, fields, message):
    with pytest.raises(ValueError, match=message):
        register(renamed_kind(**fields))
    assert tuple(DRAFT_KINDS) == SHIPPED


def test_register_takes_a_draft_kind(registry):
    with pytest.raises(ValueError, match="register takes a DraftKind, got dict"):
        register(dict(name="renamed"))


def test_a_kind_whose_model_cannot_be_imported_fails_by_name(registry):
    register(renamed_kind(model="tests.no_such_module:Head"))
    target = bigram_target(seed=4)
    with pytest.raises(ValueError, match=r"draft kind 'renamed': its model 'tests.no_such_module:Head' cannot be "
                                         r"imported: No module named 'tests.no_such_module'"):
        Engine(target, perfect_eagle(target), SpecConfig(3))


def test_a_kind_without_a_default_shape_says_so(registry):
    kind = register(renamed_kind(demo_specs=()))
    with pytest.raises(ValueError, match="draft kind 'renamed' names no default shape"):
        kind.default_spec(None)


def test_a_bundle_reads_its_drafts_by_kind(small):
    assert list(small.drafts) == list(ZOO)
    bare = zoo.Bundle(name="bare", target=small.target)
    assert bare.eagle is None and bare.mtp_chain is None and bare.draft_lm is None
    assert isinstance(bare.ngram, NgramDraft) and bare.ngram == NgramDraft()  # needs no weights
    with pytest.raises(AttributeError, match="'Bundle' object has no attribute 'medusa'"):
        bare.medusa  # noqa: B018
    assert draft_kinds.resolve("specdec.workers.eagle:EagleWorkerV2") is EagleWorkerV2


def test_every_kind_of_the_e2e_runs_has_a_random_draft_and_it_is_lossless():
    """The speed runs on a random target take each kind's draft from its record (`random_draft`): every kind the e2e
    suite runs names one, and each decodes as target-only does on a random target of another vocabulary."""
    from specdec.models import random_llama
    target = random_llama(vocab_size=300, hidden_size=64, num_hidden_layers=2, seed=4)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    base = Engine(target, max_seq_len=64).generate([prompt], SamplingParams(max_new_tokens=8))[0].token_ids
    for kind in DRAFT_KINDS.values():
        if not kind.e2e_specs:
            continue
        draft = kind.new_random_draft(target)
        assert draft is not None and kind_of(draft) is kind, kind.name
        out = Engine(target, draft, kind.e2e_specs[0], max_seq_len=64).generate([prompt], SamplingParams(
            max_new_tokens=8))[0]
        assert out.token_ids == base, kind.name


# ---- kinds registered from outside the package (specdec.register_draft_kind) ------------------------------------

def plugin_fields(**fields) -> dict:
    """A plugin's kind by its fields, its model and worker the classes themselves."""
    return {**dict(name="renamed", label="Renamed EAGLE", model=RenamedHead, worker=CountingWorker,
                   kv_margin=tree_kv_margin, shape_label=tree_shape_label, demo_specs=(SpecConfig(2, 1),)), **fields}


def test_a_plugin_kind_runs_through_the_engine_and_the_exact_law_checker(registry):
    from specdec import lab
    from specdec.models.bigram import near_bigram_target
    target = near_bigram_target(seed=21, mix=0.5, vocab_size=3, hidden_size=16, num_attention_heads=2, init_std=0.3)
    perfect = perfect_eagle(target)
    head = RenamedHead(perfect.config, target)
    head.load_state_dict(perfect.state_dict())
    kind = specdec.register_draft_kind(**plugin_fields())
    assert kind_of(head) is kind and kind_of(perfect).name == "eagle"
    assert worker_label("renamed", SpecConfig(2, 1)) == "Renamed EAGLE chain S2"
    CountingWorker.drafts = 0
    spec = SpecConfig(2, 1, draft_sampling="sample", verify="rejection")
    report = lab.exact_law(target, head, spec, SamplingParams(temperature=0.9), prompt=[1, 2], n=3, steps=1)
    assert report.max_diff < 1e-6 and CountingWorker.drafts > 0, report


@pytest.mark.parametrize("fields, message", [
    (dict(worker=None), "draft kind 'renamed' lacks worker, which the engine needs"),
    (dict(kv_margin=None, shape_label=None), "lacks kv_margin, shape_label, which the engine needs"),
    (dict(kv_margin=6), "kv_margin must be a function of the SpecConfig"),
    (dict(model=EagleDraftHead), "its model specdec.models.eagle:EagleDraftHead is the model of 'eagle'"),
    (dict(model="specdec.models.eagle:EagleDraftHead"), "is the model of 'eagle'"),
    (dict(name="eagle"), "draft kind 'eagle' is already registered"),
    (dict(worker="a worker"), "worker must be 'package.module:Name' or the class itself"),
])
def test_a_plugin_kind_the_registry_cannot_take_is_a_one_line_error(registry, fields, message):
    with pytest.raises(ValueError, match=message) as e:
        specdec.register_draft_kind(**plugin_fields(**fields))
    assert "\n" not in str(e.value) and tuple(DRAFT_KINDS) == SHIPPED


def test_a_field_the_engine_needs_left_out_is_named():
    fields = plugin_fields()
    del fields["worker"], fields["kv_margin"]
    with pytest.raises(ValueError, match="draft kind 'renamed' lacks worker, kv_margin, which the engine needs"):
        specdec.register_draft_kind(**fields)


def test_a_plugin_cannot_change_a_shipped_kind(registry):
    eagle = DRAFT_KINDS["eagle"]
    with pytest.raises(TypeError):
        DRAFT_KINDS["eagle"] = eagle  # a read-only view
    with pytest.raises(ValueError, match="draft kind 'eagle' ships with the package: it cannot be removed"):
        draft_kinds.unregister("eagle")
    specdec.register_draft_kind(**plugin_fields())
    draft_kinds.unregister("renamed")
    assert tuple(DRAFT_KINDS) == SHIPPED and DRAFT_KINDS["eagle"] is eagle
