"""The CLI turns every bad invocation into a short message and a non-zero exit, never a traceback."""
import pytest

from specdec.cli import main


@pytest.mark.parametrize("argv, message", [
    (["bench", "--num-prompts", "2", "--batch-sizes", "4"], "--batch-sizes [4] exceed --num-prompts 2"),
    (["bench", "--batch-sizes", "1 4"], "expected an integer >= 1, got '1 4'"),
    (["bench", "--batch-sizes", "1,,4"], "comma-separated integers"),
    (["bench", "--num-prompts", "0"], "expected an integer >= 1, got 0"),
    (["bench", "--max-new-tokens", "0"], "expected an integer >= 1, got 0"),
    (["bench", "--temperatures", "0,hot"], "comma-separated numbers"),
    (["bench", "--temperatures", "-1"], "finite and >= 0"),
    (["demo", "--max-new-tokens", "0"], "expected an integer >= 1, got 0"),
    (["demo", "--threads", "-2"], "--threads must be >= 0"),
])
def test_bad_arguments_are_one_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_errors_inside_a_command_are_one_line(monkeypatch, capsys):
    import specdec.demo

    def failing_demo(**kwargs):
        raise ValueError("impl='fast' needs every op the workers call")

    monkeypatch.setattr(specdec.demo, "run_demo", failing_demo)
    monkeypatch.delenv("SPECDEC_TRACEBACK", raising=False)
    assert main(["demo", "--impl", "fast"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "specdec demo: error: impl='fast' needs every op the workers call"
    monkeypatch.setenv("SPECDEC_TRACEBACK", "1")
    with pytest.raises(ValueError):
        main(["demo"])
