"""Tasks with their numbers, names and topics drawn: maths word problems, arithmetic, reasoning puzzles, code tasks,
writing, role play, science and humanities questions. The held-out split (by source) holds out whole batches of a
template's draws: a template's k-th prompt is in batch k % DRAW_BATCHES, source `gen:<category>/<name>/<batch>`.

`generated(rng, n_per_template)` -> `Task` records; the same seed gives the same list.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from . import words


DRAW_BATCHES = 10


@dataclass(frozen=True)
class Task:
    """One prompt: its category (a task type), source and user turns (a later turn follows the model's answer)."""

    category: str
    source: str
    turns: tuple[str, ...]


def _num(rng, lo, hi):
    return rng.randint(lo, hi)


def _shop(rng):
    name, (items, _) = rng.choice(words.NAMES), rng.choice(words.ITEMS)
    n, price, paid = _num(rng, 3, 19), _num(rng, 2, 9), None
    paid = n * price + _num(rng, 1, 30)
    return (f"{name} buys {n} {items} at {price} dollars each and pays with {paid} dollars. How much change does "
            f"{name} get?")


def _share(rng):
    a, b = rng.sample(words.NAMES, 2)
    items, _ = rng.choice(words.ITEMS)
    k = _num(rng, 2, 6)
    total = k * _num(rng, 4, 15) + _num(rng, 0, k - 1)
    return (f"{a} has {total} {items} and shares them equally with {b} and {k - 2} other friends, keeping none. "
            f"How many does each friend get, and how many are left over?" if k > 2 else
            f"{a} has {total} {items} and gives half of them to {b}. How many does each have now?")


def _rate(rng):
    name = rng.choice(words.NAMES)
    speed, hours, extra = _num(rng, 30, 90), _num(rng, 2, 6), _num(rng, 10, 45)
    return (f"{name} drives at {speed} km/h for {hours} hours, then {extra} km more at the same speed. How far "
            f"does {name} travel in total, and how long does the whole trip take?")


def _age(rng):
    a, b = rng.sample(words.NAMES, 2)
    age, diff, years = _num(rng, 6, 40), _num(rng, 2, 25), _num(rng, 2, 12)
    return f"{a} is {age} years old and {diff} years older than {b}. How old will {b} be in {years} years?"


def _percent(rng):
    price, pct = _num(rng, 20, 400), rng.choice((5, 10, 15, 20, 25, 30, 40, 50))
    return (f"A jacket costs {price} dollars. It is on sale for {pct}% off. What is the sale price, and how much "
            f"money is saved?")


def _work(rng):
    a, b = _num(rng, 2, 12), _num(rng, 2, 12)
    return (f"One pipe fills a tank in {a} hours and another fills it in {b} hours. How long do they take "
            f"together?")


def _garden(rng):
    w, h = _num(rng, 3, 30), _num(rng, 3, 30)
    return (f"A rectangular garden is {w} metres wide and {h} metres long. How much fencing is needed to go around "
            f"it, and what is its area?")


def _savings(rng):
    name = rng.choice(words.NAMES)
    weekly, goal = _num(rng, 5, 40), _num(rng, 100, 900)
    return f"{name} saves {weekly} dollars every week. How many weeks until {name} has at least {goal} dollars?"


def _arith(rng):
    a, b, c = _num(rng, 12, 999), _num(rng, 2, 99), _num(rng, 2, 50)
    op = rng.choice(("{a} * {b} + {c}", "({a} - {c}) * {b}", "{a} + {b} * {c}", "{a} / {c}", "{a} * {b}"))
    return f"What is {op.format(a=a, b=b, c=c)}? Show your working."


def _equation(rng):
    a, x, b = _num(rng, 2, 12), _num(rng, -10, 20), _num(rng, -30, 30)
    return f"Solve for x: {a}x + {b} = {a * x + b}."


def _fractions(rng):
    p, q, r, s = _num(rng, 1, 9), _num(rng, 2, 12), _num(rng, 1, 9), _num(rng, 2, 12)
    return f"Add the fractions {p}/{q} and {r}/{s} and simplify the result."


def _units(rng):
    v = _num(rng, 2, 500)
    pair = rng.choice((("kilometres", "miles"), ("kilograms", "pounds"), ("litres", "millilitres"),
                       ("hours", "seconds"), ("degrees Celsius", "degrees Fahrenheit"), ("metres", "centimetres")))
    return f"Convert {v} {pair[0]} to {pair[1]}."


def _sequence(rng):
    start, step = _num(rng, 1, 9), _num(rng, 2, 5)
    kind = rng.choice(("add", "mul", "square"))
    seq = ([start + step * i for i in range(5)] if kind == "add" else
           [start * step ** i for i in range(5)] if kind == "mul" else [(start + i) ** 2 for i in range(5)])
    return f"What number comes next in the sequence {', '.join(map(str, seq))}? Explain the pattern."


def _ordering(rng):
    people = rng.sample(words.NAMES, 4)
    rel = rng.choice(("taller", "older", "faster"))
    facts = [f"{people[i]} is {rel} than {people[i + 1]}" for i in range(3)]
    rng.shuffle(facts)
    return f"{'. '.join(facts)}. Who is the most {rel[:-2] if rel != 'taller' else 'tall'}? Who is the least?"


def _syllogism(rng):
    a, b = rng.sample(("cats", "birds", "teachers", "cars", "robots", "trees", "painters", "students"), 2)
    prop = rng.choice(("can swim", "are green", "like music", "sleep at night", "are made of metal"))
    return (f"If all {a} {prop} and some {b} are {a}, does it follow that some {b} {prop}? Explain whether the "
            f"argument is valid.")


def _lights(rng):
    n = _num(rng, 3, 9)
    return (f"There are {n} light switches in a row, all off. You flip every second switch, then every third switch. "
            f"Which switches are on at the end?")


CODE_TASKS = (
    "returns the n-th Fibonacci number", "checks whether a string is a palindrome",
    "counts the vowels in a string", "reverses the words of a sentence", "finds the largest number in a list",
    "removes duplicates from a list while keeping the order", "checks whether a number is prime",
    "merges two sorted lists", "returns the factorial of n", "converts Celsius to Fahrenheit",
    "counts how often each word appears in a text", "flattens a nested list", "computes the average of a list",
    "finds the second largest number in a list", "checks whether two strings are anagrams",
    "implements binary search on a sorted list", "reads a CSV file and prints the number of rows",
    "validates an email address with a simple rule", "returns the greatest common divisor of two numbers",
    "rotates a list by k positions", "capitalises the first letter of every word", "sums the digits of an integer",
    "groups a list of words by their first letter", "returns the longest word in a sentence",
)
CODE_LANGUAGES = ("Python", "Python", "Python", "JavaScript", "C", "Go", "Rust", "Java", "Bash", "TypeScript")


def _code(rng):
    task, lang = rng.choice(CODE_TASKS), rng.choice(CODE_LANGUAGES)
    return f"Write a {lang} function that {task}."


def _code_explain(rng):
    task = rng.choice(CODE_TASKS)
    return f"Explain, step by step, how you would write a program that {task}, before writing any code."


def _sql(rng):
    table = rng.choice(("orders", "employees", "students", "books", "customers", "products"))
    ask = rng.choice(("the ten most recent rows", "the number of rows per category", "the average price",
                      "every row whose name starts with 'A'", "the rows added in the last seven days"))
    return f"Write an SQL query over a table `{table}` that returns {ask}. Describe the columns you assume."


def _writing(rng):
    return f"Write {rng.choice(words.WRITING_FORMS)} about {rng.choice(words.TOPICS)}."


def _writing_edit(rng):
    return (f"Give me three ideas for {rng.choice(words.WRITING_FORMS)} about {rng.choice(words.TOPICS)}, each in "
            f"one sentence.")


def _roleplay(rng):
    me = rng.choice(("", f" My name is {rng.choice(words.NAMES)}.", " I am a visitor from another country.",
                     " I am in a hurry.", " I am a child."))
    return f"Pretend you are {rng.choice(words.ROLES)}.{me} {rng.choice(words.ROLE_SITUATIONS)}"


def _stem_explain(rng):
    who = rng.choice(("a ten-year-old", "a high-school student", "a university student", "my grandmother"))
    how = rng.choice(("", " Use an analogy.", " Keep it under 100 words.", " Include a simple example.",
                      " Then ask me a question to check my understanding."))
    return f"Explain {rng.choice(words.STEM_CONCEPTS)} to {who}.{how}"


def _stem_compare(rng):
    a, b = rng.sample(words.STEM_CONCEPTS, 2)
    return f"What is the connection, if any, between {a} and {b}?"


def _humanities_explain(rng):
    ask = rng.choice(("What was important about {t}? Answer in a few paragraphs.", "Explain {t} to a beginner.",
                      "What are the main arguments about {t}?", "Describe {t} in five bullet points.",
                      "How did {t} change people's everyday lives?"))
    return ask.format(t=rng.choice(words.HUMANITIES_TOPICS))


def _humanities_essay(rng):
    a, b = rng.sample(words.HUMANITIES_TOPICS, 2)
    return f"Write a short essay outline comparing {a} and {b}."


def _qa(rng):
    topic = rng.choice(words.STEM_CONCEPTS + words.HUMANITIES_TOPICS)
    return rng.choice((f"What is {topic}?", f"Who first studied {topic}, and when?",
                       f"Give me three facts about {topic}.", f"Why is {topic} important?"))


#: (category, template name, function of an RNG -> the first turn)
TEMPLATES = (
    ("math_reasoning", "shop", _shop), ("math_reasoning", "share", _share), ("math_reasoning", "rate", _rate),
    ("math_reasoning", "age", _age), ("math_reasoning", "percent", _percent), ("math_reasoning", "work", _work),
    ("math_reasoning", "garden", _garden), ("math_reasoning", "savings", _savings),
    ("math", "arith", _arith), ("math", "equation", _equation), ("math", "fractions", _fractions),
    ("math", "units", _units),
    ("reasoning", "sequence", _sequence), ("reasoning", "ordering", _ordering),
    ("reasoning", "syllogism", _syllogism), ("reasoning", "lights", _lights),
    ("coding", "function", _code), ("coding", "plan", _code_explain), ("coding", "sql", _sql),
    ("writing", "compose", _writing), ("writing", "ideas", _writing_edit),
    ("roleplay", "character", _roleplay),
    ("stem", "explain", _stem_explain), ("stem", "connect", _stem_compare),
    ("humanities", "explain", _humanities_explain), ("humanities", "essay", _humanities_essay),
    ("qa", "open", _qa),
)


def generated(rng: random.Random, n_per_template: int, multi_turn_every: int = 4) -> list[Task]:
    """n_per_template distinct first turns of each template (fewer where its draws repeat); every
    multi_turn_every-th prompt of a category with follow-ups gets a second turn (`words.FOLLOW_UPS`)."""
    out = []
    for category, name, make in TEMPLATES:
        seen: set[str] = set()
        for _ in range(n_per_template * 4):
            if len(seen) >= n_per_template:
                break
            first = make(rng)
            if first in seen:
                continue
            seen.add(first)
            follow = words.FOLLOW_UPS.get(category)
            turns = (first, rng.choice(follow)) if follow and len(seen) % multi_turn_every == 0 else (first,)
            out.append(Task(category, f"gen:{category}/{name}/{len(seen) % DRAW_BATCHES}", turns))
    return out
