"""The notebooks run top to bottom (their cells assert what they claim)."""
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


@pytest.mark.parametrize("name", ["01_correctness_walkthrough.ipynb", "02_gpu_throughput.ipynb",
                                  "03_structured_output.ipynb"])
def test_notebook_runs(name):
    if name.startswith("03"):
        pytest.importorskip("xgrammar")
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
