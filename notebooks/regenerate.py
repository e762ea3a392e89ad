"""Execute every notebook top to bottom and save it with its outputs: `python notebooks/regenerate.py`.

The committed notebooks carry the outputs of their last full run; the test suite executes them too
(tests/test_notebooks.py), so a claim that stops holding fails there before it is committed stale."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOKS = ["01_correctness_walkthrough.ipynb", "02_results_viewer.ipynb", "03_structured_output.ipynb",
             "04_real_model.ipynb", "05_a_new_idea.ipynb"]


def main() -> int:
    import nbclient
    import nbformat
    for name in NOTEBOOKS:
        path = HERE / name
        nb = nbformat.read(path, as_version=4)
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(HERE)}}).execute()
        nbformat.write(nb, path)
        print(f"executed and saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
