"""The command line's shared vocabulary: the help formatter, the argument types and the help texts that `specdec`'s
commands and the modules with their own parsers (`specdec tune`, `specdec gpu-check`, `specdec zoo train`) share.
It sits below every parser, so none of them imports the `specdec` command itself; `about` is the estimates' duration
wording they share (the trainer's included, which so does not reach up into the bench)."""
from __future__ import annotations

import argparse

import torch

from .draft_kinds import DRAFT_KINDS
from .verify_rules import VERIFY_RULES


def about(seconds: float) -> str:
    """A duration as a person says it (the estimates `specdec bench`, `tune` and `zoo train` print): "about 40
    seconds", "about 12 minutes", "about 2.5 hours"."""
    if seconds < 90:
        return f"about {max(5, round(seconds / 5) * 5):.0f} seconds"
    if seconds < 90 * 60:
        return f"about {seconds / 60:.0f} minutes"
    return f"about {seconds / 3600:.1f} hours"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """States each option's default once: appended where the help text does not state it and there is one to state
    (not None, False or empty), a list as it is typed (comma-separated)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default is argparse.SUPPRESS
                or (isinstance(default, (str, list, tuple)) and not default)
                or "%(default)" in text or "default:" in text or "(default" in text
                or not (action.option_strings or action.nargs in ("?", "*"))):
            return text
        if isinstance(default, (list, tuple)):
            default = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in default)
        return f"{text} (default: {str(default).replace('%', '%%')})"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def positive_int_list(text: str) -> list[int]:
    """'1,4,16' -> [1, 4, 16]."""
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1 such as '1,4,16', got {text!r}")
    return [positive_int(p) for p in parts]


def float_list(text: str) -> list[float]:
    """'0,0.7' -> [0.0, 0.7] (temperatures: finite, >= 0)."""
    try:
        values = [float(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as '0,0.7', got {text!r}") from None
    if not all(0 <= v < float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"temperatures must be finite and >= 0, got {text!r}")
    return values


MODEL_HELP = ("the model to run: a zoo name (`specdec zoo list`: a shipped pair, or a released model read from its "
              "installed GGUF file), a .gguf file, or a Hugging Face model directory (config.json, safetensors, "
              "tokenizer.json), whose chat template and end-of-sequence ids come with it; auto: the deep pair, whose "
              "draft steps cost what real drafts cost, when it ships, else the small one")

MODEL_PATH_HELP = ("a zoo name (`specdec zoo list`: a shipped pair, or a released model read from its installed GGUF "
                   "file), a .gguf file, or a Hugging Face model directory (config.json, safetensors, tokenizer.json), "
                   "whose chat template and end-of-sequence ids come with it")

DRAFT_DIR_HELP = ("a draft directory `specdec zoo train-draft` wrote for this model (its --out, or one draft's "
                  "directory), in place of the model's draft of the same kind; refused when it was trained for another "
                  "target (repeatable); or `scripted:0.8,0.7,0.6`, the lab's scripted draft of that agreement by "
                  "depth with the target's own continuations (specdec.lab.scripted)")

PROMPTS_HELP = ("a prompt file, one prompt a line: MT-Bench's and Spec-Bench's JSON lines ({\"question_id\", "
                "\"category\", \"turns\": [...]}), chat lines ({\"messages\": [...]}) or plain text (default: the "
                "toolkit's own held-out set for the model, specdec/zoo/heldout/)")

TURNS_HELP = ("with --prompts: first, each prompt's first turn; all, every turn, a later one asked after the target's "
              "own greedy answer to those before it (MT-Bench's practice)")


def category_list(text: str) -> list[str]:
    """'writing,coding' -> ['writing', 'coding'] (a prompt file's categories)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated category names such as 'writing,coding', got "
                                         f"{text!r}")
    return parts


def add_prompt_arguments(p) -> None:
    """--prompts FILE, --categories, --turns: a command's prompts from a prompt file (`specdec.prompt_sets`)."""
    p.add_argument("--prompts", metavar="FILE", default=None, help=PROMPTS_HELP)
    p.add_argument("--categories", type=category_list, default=None,
                   help="only the prompts of these categories (comma-separated), of --prompts or the default set")
    p.add_argument("--turns", default="first", choices=["first", "all"], help=TURNS_HELP)

DEVICE_HELP = "where the models run: auto (cuda when a CUDA device is present, else cpu), cpu, cuda or cuda:N"


def device_choice(text: str) -> str:
    """'auto' | a torch device string whose device exists here -> the device to run on."""
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {text!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"--device {text}: no CUDA device is available here")
    if dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {text!r}")
    return text


def confidence_threshold(text: str) -> float:
    """'0.3' -> 0.3 (a DSpark confidence threshold: in [0, 1], 0 the whole block)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a confidence threshold must be in [0, 1], got {text!r}")
    return value


def confidence_threshold_list(text: str) -> list[float]:
    """'0.5,0.3,0' -> [0.5, 0.3, 0.0] (DSpark confidence thresholds: each in [0, 1], 0 the whole block)."""
    try:
        values = [float(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as '0.5,0.3,0', got {text!r}") \
            from None
    if not all(0 <= v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"confidence thresholds must be in [0, 1], got {text!r}")
    return list(dict.fromkeys(values))


def top_p_list(text: str) -> list[float]:
    """'1,0.9' -> [1.0, 0.9] (each in (0, 1])."""
    try:
        values = [float(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as '1,0.9', got {text!r}") from None
    if not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"top-p values must be in (0, 1], got {text!r}")
    return values


def verify_rules_arg(text: str) -> list[str]:
    """'target_only,block' -> ['target_only', 'block'] (each a registered `SpecConfig.verify` rule)."""
    rules = [p.strip() for p in text.split(",")]
    bad = [r for r in rules if r not in VERIFY_RULES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown verify rule(s) {bad}; expected a comma-separated subset of "
                                         f"{','.join(VERIFY_RULES)}")
    return rules


def draft_kinds_arg(text: str) -> list[str]:
    """'eagle,eagle3' -> ['eagle', 'eagle3'] (each one of DRAFT_KINDS)."""
    kinds = [p.strip() for p in text.split(",")]
    bad = [k for k in kinds if k not in DRAFT_KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown draft(s) {bad}; expected a comma-separated subset of "
                                         f"{','.join(DRAFT_KINDS)}")
    return kinds


THREADS_HELP = ("torch CPU threads, 0 for torch's own choice; the shipped models are small enough that one thread is "
                "fastest, and a loaded machine slows one thread least")

IMPL_HELP = "ops: reference (PyTorch), fast (Triton; interpreted on a CPU), auto (fast on CUDA)"
