"""`specdec bench --suite repetitive`: repetitive, agent-like requests, where what a model writes is mostly text it
has seen (in its prompt, or in earlier requests' answers), and the model-free drafts (NGRAM, suffix decoding) and
the trained kinds side by side on them; one CSV (the acceptance suite's schema, `results/repetitive-<run_id>.csv`)
and the prompt file it decoded beside it.

The requests are built from text every machine that runs specdec has, the interpreter's standard-library sources
(`specdec.zoo.corpus.files`, the held-out split's sources, `specdec.zoo.chat_prompts.split_of`), in three
categories, one after another in turn:

- `tool-call`: one JSON tool schema (a function of the standard library to call), filled again and again: each
  request names another function and asks for the call as JSON in the format its example shows;
- `code-edit`: a function's source and a rename of one of its names; the answer is the function again, most of it
  copied;
- `multi-turn`: a conversation whose earlier assistant turn explained a function (its docstring), and a last user
  turn that asks for that explanation quoted word for word before a sentence more.

`repetitive_prompts(n, seed)` -> the conversations (lists of {"role", "content"}) with their categories;
`write_prompt_file(path, n, seed)` writes them as chat lines, the JSON-lines format `specdec.prompt_files.read_prompts`
reads.
"""
from __future__ import annotations

import ast
import functools
import json
import random
import textwrap
from pathlib import Path

from ...zoo.chat_prompts import split_of, source_of, subjects
from ...zoo.corpus import files

CATEGORIES = ("tool-call", "code-edit", "multi-turn")
#: a function whose source a code edit copies: long enough to fill an answer of the bench's lengths, short enough
#: for a small model's context
CODE_LINES = (12, 40)

TOOL_SCHEMA = {
    "name": "call_python_function",
    "description": "Call a function of the Python standard library and return its result.",
    "parameters": {"type": "object",
                   "properties": {"module": {"type": "string", "description": "the module that defines it"},
                                  "function": {"type": "string", "description": "the function's name"},
                                  "arguments": {"type": "object", "description": "keyword arguments by name"}},
                   "required": ["module", "function", "arguments"]},
}


def _tool_call(module: str, function: str, params: list[str]) -> str:
    return json.dumps({"name": TOOL_SCHEMA["name"], "arguments": {
        "module": module, "function": function, "arguments": {p: f"<{p}>" for p in params}}})


@functools.lru_cache(maxsize=2)
def _functions(split: str = "heldout") -> list[tuple[str, str, list[str], str]]:
    """(module, function, its parameters, its source) of every public top-level function of the split's
    sources whose source is CODE_LINES long, in file order."""
    out = []
    for rel, data in files("all"):
        if split_of(source_of(rel)) != split or "/test" in rel or rel.startswith("test"):
            continue
        text = data.decode("utf-8", "replace")
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        module = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        lines = None
        for node in tree.body:
            if (isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and not node.decorator_list
                    and CODE_LINES[0] <= node.end_lineno - node.lineno + 1 <= CODE_LINES[1]):
                lines = lines or text.splitlines(keepends=True)
                src = "".join(lines[node.lineno - 1:node.end_lineno]).rstrip()
                params = [a.arg for a in node.args.args + node.args.kwonlyargs if a.arg != "self"]
                out.append((module, node.name, params, src))
    return out


def _renamable(src: str, params: list[str]) -> str | None:
    """A parameter the function's body uses, to rename."""
    used = [p for p in params if len(p) > 2 and src.count(p) >= 3]
    return used[0] if used else None


def repetitive_prompts(n: int, seed: int = 0) -> list[tuple[str, list[dict]]]:
    """-> n (category, conversation) pairs, the categories in turn (`CATEGORIES`), each drawn from `seed`."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    functions = _functions()
    editable = [f for f in functions if _renamable(f[3], f[2])]
    documented = [s for s in subjects("heldout") if 200 <= len(s.doc) <= 900]
    example = _tool_call("textwrap", "shorten", ["text", "width"])
    system = ("You can call this tool:\n" + json.dumps(TOOL_SCHEMA, indent=2) +
              "\nAnswer a request with the call alone, as JSON, in this format:\n" + example)
    out = []
    for i in range(n):
        category = CATEGORIES[i % len(CATEGORIES)]
        if category == "tool-call":
            module, name, params, _ = rng.choice(functions)
            user = (f"Call `{module}.{name}` with its arguments {', '.join(params) or '(none)'} set to placeholders "
                    f"named after them.")
            out.append((category, [{"role": "system", "content": system}, {"role": "user", "content": user}]))
        elif category == "code-edit":
            module, name, params, src = rng.choice(editable)
            old = _renamable(src, params)
            user = (f"Here is `{module}.{name}`:\n\n```python\n{textwrap.dedent(src)}\n```\n\nRename its parameter "
                    f"`{old}` to `{old}_value` everywhere and return the whole function.")
            out.append((category, [{"role": "user", "content": user}]))
        else:
            subject = rng.choice(documented)
            out.append((category, [
                {"role": "user", "content": f"What does `{subject.name}` do?"},
                {"role": "assistant", "content": subject.doc},
                {"role": "user", "content": "Quote your previous answer word for word, then add one sentence on "
                                            "when to use it."}]))
    return out


def write_prompt_file(path, n: int, seed: int = 0) -> Path:
    """`repetitive_prompts(n, seed)` as chat lines ({"question_id", "category", "messages"}) -> the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i, (category, messages) in enumerate(repetitive_prompts(n, seed)):
            f.write(json.dumps({"question_id": i, "category": category, "messages": messages}) + "\n")
    return path


def prompt_ids(tokenizer, prompts) -> list[list[int]]:
    """`read_prompts` records rendered for a target: through its chat template where it has one, else the turns'
    text joined (a byte-level pair)."""
    if getattr(tokenizer, "chat_template", None):
        return [list(tokenizer.apply_chat_template(p.conversation(), add_generation_prompt=True, tokenize=True))
                for p in prompts]
    return [list(tokenizer.encode("\n\n".join(m["content"] for m in p.conversation()))) for p in prompts]


def main_repetitive(args) -> int:
    """`specdec bench --suite repetitive`: the prompt file written to --out, then target-only and the asked drafts
    (default: the kinds that need no weights, NGRAM and suffix decoding) on it at each kind's default shape (every
    demo shape with --shapes demo or all), at each of --temperatures, one CSV beside it."""
    # lazy: the CLI imports the bench at start; the zoo loads the models on use
    from ... import zoo
    from ...draft_kinds import DRAFT_KINDS
    from ...prompt_files import read_prompts
    from ..cases import CASES, by_kind, offered_kinds
    from ..common import DTYPES
    from .acceptance import estimate, run_benchmark

    name = "smollm2-135m-instruct" if args.model == "auto" else args.model
    bundle = zoo.load(name, device=args.device, dtype=DTYPES[args.dtype])
    kinds = args.workers or [k for k, kind in DRAFT_KINDS.items() if kind.untrained]
    drafts = {kind: getattr(bundle, kind) for kind in offered_kinds(bundle, kinds)}
    out = Path(args.out)
    prompt_file = write_prompt_file(out / f"repetitive-prompts-n{args.num_prompts}.jsonl", args.num_prompts)
    prompts = prompt_ids(bundle.tokenizer, read_prompts(prompt_file))
    cases = [c for c in by_kind(CASES) if c.spec is None or (c.kind in drafts and (
        args.shapes in ("demo", "all") or c.spec == DRAFT_KINDS[c.kind].default_spec(drafts[c.kind])))]
    stop = list(getattr(bundle.tokenizer, "eos_token_ids", ()))
    print(f"specdec bench --suite repetitive: {bundle.name!r}, {len(prompts)} requests of "
          f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens from {prompt_file} ({', '.join(CATEGORIES)}), "
          f"{', '.join(c.label for c in cases)}")
    sizes = args.batch_sizes or [1]
    print(estimate(bundle.target, cases, prompts, sizes, args.temperatures, args.max_new_tokens, args.repeats,
                   args.impl, args.top_ps, args.check_prompts))
    path = run_benchmark(bundle.target, drafts, cases, prompts, sizes, args.temperatures, args.max_new_tokens,
                         model_name=bundle.name, impl=args.impl, repeats=args.repeats, out_dir=args.out,
                         tag="repetitive", stop_token_ids=stop, top_ps=args.top_ps, check_prompts=args.check_prompts)
    print(f"wrote {path} (prompts: {prompt_file})")
    return 0
