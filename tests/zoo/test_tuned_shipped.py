"""The tuned files shipped with the zoo's pairs (`specdec/zoo/tuned/`): `spec="tuned:<pair>"` loads the one of the
draft's kind, decodes exactly what target-only decoding gives, and a pair or kind with no file is refused in one
line that lists what ships."""
from __future__ import annotations

import json
import shutil

import pytest

from specdec import Engine, SamplingParams, zoo
from specdec.tuning import SHIPPED_DIR
from tests.helpers import installed_gguf

#: what ships, written out by hand: a file added or removed must be added or removed here too
SHIPPED = {("stdlib-byte-24l", "draft_lm"), ("stdlib-byte-24l", "eagle"), ("stdlib-byte-24l", "ngram"),
           ("stdlib-byte-6l", "eagle"), ("smollm2-135m-instruct", "eagle3")}


@pytest.fixture(scope="module")
def bundles():
    return {name: zoo.load(name) for name in sorted({pair for pair, _ in SHIPPED})
            if name not in zoo.REAL_TARGETS or installed_gguf() is not None}


def test_each_shipped_file_names_its_pair_and_kind_and_loads_on_them(bundles):
    found = {tuple(p.stem.rsplit("-", 1)) for p in SHIPPED_DIR.glob("*.json")}
    assert found == SHIPPED
    for pair, kind in sorted(SHIPPED):
        if pair not in bundles:  # a real target whose package is not installed
            continue
        data = json.loads((SHIPPED_DIR / f"{pair}-{kind}.json").read_text())
        assert (data["target"]["name"], data["draft"]["kind"]) == (pair, kind)
        b = bundles[pair]
        # the engine checks the file's fingerprints against these weights: a stale file fails here
        engine = Engine(b.target, getattr(b, kind), f"tuned:{pair}", impl="reference", max_seq_len=256)
        assert engine.tuned.path == str(SHIPPED_DIR / f"{pair}-{kind}.json")
        assert engine.tuned.draft["kind"] == kind


@pytest.mark.parametrize("how", ["tuned", "adaptive"])
def test_tuned_pair_decodes_what_target_only_decodes(bundles, how):
    b = bundles["stdlib-byte-6l"]
    prompts = [b.tokenizer.encode(t) for t in ("def parse(line):\n    ", "import sys\nfor ")]
    params = SamplingParams(max_new_tokens=24)
    want = Engine(b.target, impl="reference", max_seq_len=256).generate(prompts, params)
    engine = Engine(b.target, b.eagle, f"{how}:stdlib-byte-6l", impl="reference", max_seq_len=256)
    got = engine.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert engine.tuned.adaptive == (how == "adaptive")
    assert engine.last_stats.step_shapes  # the steps ran the file's shapes
    assert engine.last_stats.mean_accept_len > 1.0


def test_a_path_still_loads_as_a_path(bundles, tmp_path):
    b = bundles["stdlib-byte-6l"]
    copy = tmp_path / "mine.json"
    shutil.copy(SHIPPED_DIR / "stdlib-byte-6l-eagle.json", copy)
    assert Engine(b.target, b.eagle, f"tuned:{copy}", impl="reference").tuned.path == str(copy)


def test_an_unknown_pair_or_a_kind_with_no_file_is_one_line_listing_what_ships(bundles):
    b = bundles["stdlib-byte-6l"]
    listing = (r"shipped: smollm2-135m-instruct \(eagle3\), stdlib-byte-24l \(draft_lm, eagle, ngram\), "
               r"stdlib-byte-6l \(eagle\)")
    cases = [("tuned:no-such-pair", b.eagle, r"no tuned file ships for pair 'no-such-pair' with a draft of kind "
                                             r"'eagle'; " + listing),
             ("adaptive:stdlib-byte-6l", b.draft_lm, r"pair 'stdlib-byte-6l' with a draft of kind 'draft_lm'; "
                                                     + listing),
             ("tuned:stdlib-byte-6l", None, r"'tuned:stdlib-byte-6l': a tuned spec needs the draft")]
    for spec, draft, message in cases:
        with pytest.raises(ValueError, match=message) as e:
            Engine(b.target, draft, spec, impl="reference")
        assert "\n" not in str(e.value)
    # a file of another pair is refused by its fingerprint, whichever way it was named
    with pytest.raises(ValueError, match=r"target\.fingerprint .* \(stdlib-byte-24l\) is not this target's"):
        Engine(b.target, b.eagle, "tuned:stdlib-byte-24l", impl="reference")


def test_bench_tuned_takes_a_path_or_the_benchs_pair():
    from specdec.bench.suites.acceptance import tuned_paths
    assert sorted(p.name for p in tuned_paths(["stdlib-byte-24l"], "stdlib-byte-24l")) == [
        "stdlib-byte-24l-draft_lm.json", "stdlib-byte-24l-eagle.json", "stdlib-byte-24l-ngram.json"]
    assert [str(p) for p in tuned_paths(["results/x.json"], "stdlib-byte-24l")] == ["results/x.json"]
    with pytest.raises(ValueError, match=r"--tuned 'stdlib-byte-6l' names a pair, but the bench runs "
                                         r"'stdlib-byte-24l'"):
        tuned_paths(["stdlib-byte-6l"], "stdlib-byte-24l")
