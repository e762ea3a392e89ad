"""The documents a newcomer reads: a README that fits on a few screens, a results page that is what `specdec report`
prints from the committed CSVs, and no work-log history in any tracked text file."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: the word a work-log entry is headed by; the examples below are built from it, so that this file itself holds no
#: such entry and the scan reads it like every other file
ENTRY = "sess" + "ion"
#: work-log entries as the project's documents once numbered them (the word above with a number, "this <word>") and
#: internal issue numbers ("#" with one or two digits, "issue #N"); pytest's session-scoped fixtures are not that
WORK_LOG = re.compile(rf"\b[Ss]{ENTRY[1:]}s? \d+|\b[Tt]his {ENTRY}\b|\b[Ii]ssues? #\d+|(?<![\w&/#])#\d{{1,2}}\b(?!\w)")
#: binary or generated files that the check does not read
SKIPPED_SUFFIXES = {".png", ".safetensors", ".npy", ".gguf", ".csv", ".log"}


def tracked_text_files() -> list[Path]:
    try:
        names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / n for n in names.splitlines() if Path(n).suffix not in SKIPPED_SUFFIXES and (ROOT / n).is_file()]


def test_work_log_pattern_catches_what_it_should():
    for text in [f"{ENTRY.title()} 22: the heads", f"this {ENTRY}", f"({ENTRY} 23's run)", "the goals of #" + "32",
                 "issue #" + "14", f"{ENTRY}s 18-23"]:
        assert WORK_LOG.search(text), text
    for text in ['@pytest.fixture(scope="session")', "SGLang #26312", "vLLM #41044", "color: #fff",
                 "session-scoped", "&#39;"]:
        assert not WORK_LOG.search(text), text


def test_no_work_log_in_tracked_text():
    found = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if WORK_LOG.search(line):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not found, "work-log entries or internal issue numbers:\n" + "\n".join(found[:40])


def test_readme_fits_on_a_few_screens():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines (at most 300)"


def test_results_page_is_what_report_prints():
    from specdec.bench.report.results_page import render_page
    committed = (ROOT / "docs" / "results.md").read_text()
    assert committed == render_page(ROOT), "docs/results.md differs from `specdec report`: run " \
                                           "`specdec report > docs/results.md`"


def test_results_page_names_every_csv_it_quotes():
    """Each section's CSV exists, and every committed CSV is either a section's or in the archive."""
    import json
    manifest = json.loads((ROOT / "results" / "current.json").read_text())
    page = (ROOT / "docs" / "results.md").read_text()
    for section in manifest["sections"]:
        assert (ROOT / section["csv"]).is_file(), section["csv"]
    for csv in (ROOT / "results").rglob("*.csv"):
        assert f"`{csv.relative_to(ROOT).as_posix()}`" in page, csv


def test_docs_links_resolve():
    """Every relative link of README.md and docs/*.md points at a file or directory of the repository."""
    missing = []
    for doc in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                missing.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not missing, "\n".join(missing)


def module_map_paths(design: str) -> dict[str, str]:
    """design.md's module map (the first code block under "## Module map", a tree indented by two spaces a level)
    -> {path of each file or folder it names: its line}."""
    block = design.split("## Module map", 1)[1].split("```", 2)[1]
    named, folders = {}, []  # folders: (indent, "name/") from the root down to the current line
    for line in block.splitlines()[1:]:
        m = re.match(r"( *)(\S+)", line)
        if not m or not m[2].endswith(("/", ".py")):
            continue  # a description's continuation
        indent, name = len(m[1]), m[2]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        path = "".join(f for _, f in folders) + name
        named[path] = line
        if name.endswith("/"):
            folders.append((indent, name))
    return named


def test_module_map_names_every_module_of_the_package():
    """Every module of specdec/ has its line in design.md's module map, under its own folder (a package's __init__
    and __main__ may be said on the package's line), and the map names no module that is not there."""
    named = module_map_paths((ROOT / "docs" / "design.md").read_text())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "specdec").rglob("*.py") if "__pycache__" not in p.parts}
    missing = []
    for module in sorted(modules):
        folder, name = module.rsplit("/", 1)
        if module in named or name == "__init__.py":
            continue
        if name == "__main__.py" and "__main__.py" in named.get(folder + "/", ""):
            continue
        missing.append(module)
    assert not missing, f"docs/design.md's module map lacks: {missing}"
    stale = sorted(p for p in named if p.startswith("specdec/") and p.endswith(".py") and p not in modules)
    assert not stale, f"docs/design.md's module map names modules that do not exist: {stale}"


def test_module_map_reader_places_a_module_under_its_folder():
    """The reader of the map above, on a map written by hand: nesting, a continuation line, a folder closed by a
    line less indented."""
    design = "## Module map\n\n```\nspecdec/\n  a.py  one\n        more words\n  sub/  a folder\n    b.py  two\n" \
             "  c.py  three\nreference/\n```\n"
    assert set(module_map_paths(design)) == {"specdec/", "specdec/a.py", "specdec/sub/", "specdec/sub/b.py",
                                             "specdec/c.py", "reference/"}


def usage_example(heading: str) -> str:
    """The Python block of docs/usage.md's section `heading`."""
    section = (ROOT / "docs" / "usage.md").read_text().split(f"### {heading}\n", 1)[1].split("\n#", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("heading, name, lossless", [("Adding a verification rule", "uniform_q", False),
                                                     ("Adding a kind", "table_draft", True)])
def test_the_plugin_examples_run_and_the_checker_says_what_they_say(heading, name, lossless, capsys):
    """Each example registers from outside the package, and the exact-law checker finds its configuration lossless or
    not as its comment says; what it registered leaves with it."""
    from specdec import draft_kinds, verify_rules
    space = {"__name__": "usage_example"}
    try:
        exec(compile(usage_example(heading), f"docs/usage.md, {heading}", "exec"), space)
    finally:
        for registry in (verify_rules.VERIFY_RULES, draft_kinds.DRAFT_KINDS):
            if name in registry:
                (verify_rules if registry is verify_rules.VERIFY_RULES else draft_kinds).unregister(name)
    assert (space["report"].max_diff < 1e-6) == lossless and "largest difference" in capsys.readouterr().out
    assert name not in verify_rules.VERIFY_RULES and name not in draft_kinds.DRAFT_KINDS
