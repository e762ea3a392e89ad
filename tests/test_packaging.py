"""What a wheel ships: every data file of the package (weights, cards, token rankings, prompt sets, tuned shapes)
is matched by a package-data pattern of pyproject.toml, so a non-editable install has what a checkout has; the
licence files are there."""
import glob
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_data_file_is_package_data():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    covered = set()
    for package, patterns in cfg.items():
        base = ROOT / package.replace(".", "/")
        for pattern in patterns:
            covered |= {Path(p).resolve() for p in glob.glob(str(base / pattern)) if Path(p).is_file()}
    data = {p.resolve() for p in (ROOT / "specdec").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    missing = sorted(str(p.relative_to(ROOT)) for p in data - covered)
    assert not missing, f"not package data (a wheel would lack them): {missing}"


def test_licence_notice_and_citation_ship_with_the_source():
    for name in ("LICENSE", "NOTICE", "CITATION.cff"):
        assert (ROOT / name).is_file(), name
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert "SmolLM2" in (ROOT / "NOTICE").read_text()
