"""The prompts a command decodes, as token ids with their categories: a user's prompt file (`--prompts FILE`, read by
`specdec.prompt_files.read_prompts`) or, by default, the toolkit's own held-out set for the model, shipped in the same
format (`specdec.zoo.heldout_sets`: instructions about held-out standard-library modules for a model with a chat
template, held-out standard-library code for the byte pairs).

A prompt reaches the target through its tokenizer's chat template where the model has one (`Bundle.chat`), else as
its text. With turns="all" a prompt's later turns are asked after the target's own greedy answer to those before it,
as MT-Bench asks them (`Prompt.conversation`): the answers are decoded target-only first, so every worker decodes the
same requests and stays comparable with target-only token for token.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import SamplingParams
from .engine import Engine
from .prompt_files import Prompt, read_prompts
from .zoo.heldout_sets import heldout_set

TURNS = ("first", "all")


@dataclass(frozen=True)
class Request:
    """One request of a command: its prompt's ids, the prompt's category and question id, and which turn it asks
    (0: the first)."""

    ids: list[int]
    category: str
    question_id: object = None
    turn: int = 0


def default_set(bundle) -> Path:
    """The held-out set a model decodes when no prompt file is given: the chat set for a model with a chat template
    (`Bundle.chat`), the code set otherwise (the byte pairs, trained on code)."""
    return heldout_set("chat" if bundle.chat else "code")


def encode(tokenizer, conversation: list[dict], chat: bool) -> list[int]:
    """A conversation (messages ending with the user's) -> its prompt's ids: through the tokenizer's chat template
    with the assistant's opening when `chat`, else the messages' text, one after another on lines of their own."""
    if chat:
        return list(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True))
    return list(tokenizer.encode("\n".join(m["content"] for m in conversation)))


def cut_at_line_end(ids: list[int], length: int, newline_id: int) -> list[int]:
    """The first `length` ids, ending just after the last newline among them where that keeps at least half of them
    (a code prompt the model continues with a fresh line, as `corpus.heldout_prompts` cuts one)."""
    head = ids[:length]
    ends = [i for i, t in enumerate(head) if t == newline_id]
    return head[:ends[-1] + 1] if ends and ends[-1] + 1 >= length // 2 else head


def answer_turns(bundle, prompts: list[Prompt], max_new_tokens: int, batch_size: int = 16) -> list[list[str]]:
    """Each prompt's turns but the last, answered by the target itself, greedy, target-only, one turn after another
    (a turn after the answers to those before it), stopping at its end-of-sequence ids -> per prompt, the answers'
    text."""
    answers = [[] for _ in prompts]
    engine = Engine(bundle.target, max_batch=batch_size)
    params = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=bundle.stop_token_ids)
    stop = set(bundle.stop_token_ids)
    for turn in range(max(p.num_turns for p in prompts) - 1):
        rows = [i for i, p in enumerate(prompts) if p.num_turns > turn + 1]
        for lo in range(0, len(rows), batch_size):
            batch = rows[lo:lo + batch_size]
            ids = [encode(bundle.tokenizer, prompts[i].conversation(answers[i]), bundle.chat) for i in batch]
            for i, out in zip(batch, engine.generate(ids, params)):
                answers[i].append(bundle.tokenizer.decode([t for t in out.token_ids if t not in stop]))
    return answers


def requests_of(bundle, prompts: list[Prompt], turns: str = "first", max_new_tokens: int = 128) -> list[Request]:
    """Prompt records -> the requests a command decodes, in the file's order: each prompt's first turn, or with
    turns="all" every turn (`answer_turns`, `max_new_tokens` each), a prompt's turns one after another."""
    if turns not in TURNS:
        raise ValueError(f"turns must be one of {', '.join(TURNS)}, got {turns!r}")
    answers = answer_turns(bundle, prompts, max_new_tokens) if turns == "all" else [[] for _ in prompts]
    out = []
    for p, said in zip(prompts, answers):
        for turn in range(p.num_turns if turns == "all" else 1):
            out.append(Request(encode(bundle.tokenizer, p.conversation(said[:turn]), bundle.chat), p.category,
                               p.question_id, turn))
    return out


def load_requests(bundle, path=None, categories=None, turns: str = "first", num_prompts: int | None = None,
                  skip: int = 0, prompt_len: int | None = None, max_new_tokens: int = 128) -> list[Request]:
    """A command's requests: the prompts of `path` (default: the model's held-out set, `default_set`) of
    `categories`, the `num_prompts` after the first `skip` (all when None), as `requests_of` makes them. A code
    prompt of the default set is cut to `prompt_len` tokens at a line end (`cut_at_line_end`); a prompt file's
    prompts are decoded as they are. A file with no prompt there is a one-line ValueError naming it."""
    source = Path(path) if path is not None else default_set(bundle)
    prompts = read_prompts(source, categories)
    chosen = prompts[skip:] if num_prompts is None else prompts[skip:skip + num_prompts]
    if not chosen:
        raise ValueError(f"prompt file {str(source)!r} holds {len(prompts)} prompts"
                         + (f" of categories {', '.join(categories)}" if categories else "")
                         + f", none after the first {skip}")
    requests = requests_of(bundle, chosen, turns, max_new_tokens)
    if path is None and not bundle.chat and prompt_len is not None:
        newline = bundle.tokenizer.encode("\n")[-1]
        requests = [Request(cut_at_line_end(r.ids, prompt_len, newline), r.category, r.question_id, r.turn)
                    for r in requests]
    return requests
