"""`specdec generate --model` without --draft decodes with what was measured fastest for the model: of its tuned
files, the kind whose batch-size-1 shape gained most over target-only in its own run; with no such measurement,
target-only with a note (never a configuration measured slower than target-only)."""
import json
import shutil
import types

import pytest

from specdec import tuning, zoo
from specdec.cli.generate import measured_default, zoo_draft
from specdec.draft_kinds import DRAFT_KINDS


def shipping_every_kind(name):
    """A stand-in for a pair that ships a draft of every kind (what `measured_default` reads of a bundle), so that
    no model is loaded to check the choice."""
    return types.SimpleNamespace(name=name, **{kind: object() for kind in DRAFT_KINDS})


def gain(path):
    """accepted tokens per ms of the B = 1 shape over target-only's tokens per ms, from the file's own numbers."""
    b = json.loads(open(path).read())["buckets"]["1"]
    cands = {tuple(c["shape"].values()): c for c in b["candidates"]}
    chosen, alone = cands[tuple(b["shape"].values())], cands[(0, 0, 1)]
    return chosen["mean_accept_len"] / chosen["step_ms"] * alone["step_ms"]


def test_the_fastest_measured_kind_is_the_default():
    bundle = shipping_every_kind("stdlib-byte-24l")
    files = {kind: p for (pair, kind), p in tuning.shipped_files().items() if pair == bundle.name}
    assert len(files) >= 2
    best = max(files, key=lambda k: gain(files[k]))
    kind, spec = measured_default(bundle)
    assert kind == best and gain(files[best]) > 1
    shape = json.loads(open(files[best]).read())["buckets"]["1"]["shape"]
    assert (spec.num_steps, spec.topk, spec.num_draft_tokens) == tuple(shape.values())


def test_no_measured_gain_decodes_target_only_with_a_note(tmp_path, monkeypatch):
    bundle = zoo.load("stdlib-byte-6l")
    (pair, kind), path = next(((k, p) for k, p in tuning.shipped_files().items() if k[0] == bundle.name))
    slow = json.loads(open(path).read())
    b = slow["buckets"]["1"]
    for c in b["candidates"]:  # every drafting shape now costs ten target-only steps
        if tuple(c["shape"].values()) != (0, 0, 1):
            c["step_ms"] = 10 * next(x["step_ms"] for x in b["candidates"] if tuple(x["shape"].values()) == (0, 0, 1))
    shutil.copy(path, tmp_path / "orig.json")
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    monkeypatch.setattr(tuning, "shipped_files", lambda: {(pair, kind): str(tmp_path / "slow.json")})
    assert measured_default(bundle)[0] is None
    draft, spec, note = zoo_draft(bundle, None)
    assert draft is None and spec is None and "decoding target-only" in note
    assert zoo_draft(bundle, kind)[0] is not None  # asked for by name, it still runs


@pytest.mark.skipif(not tuning.shipped_files(), reason="no tuned file ships")
def test_every_shipped_default_is_measured_faster_than_target_only():
    for name in {pair for pair, _ in tuning.shipped_files()}:
        kind, _ = measured_default(shipping_every_kind(name))
        if kind is not None:
            assert gain(tuning.shipped_files()[(name, kind)]) > 1
