"""The docs stay true to the tree: docs/benchmarks.md is generated from the saved results (no figure typed by
hand, each result's command on the page, short enough to read), and every file, variable and flag the docs
name exists, and every section they point at."""
from __future__ import annotations

import ast
import fnmatch
import importlib.util
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"
TEMPLATE = ROOT / "docs" / "benchmarks.template.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").rglob("*.md"))]
MAX_PAGE_LINES = 600  # the page is the current answer, read in a few minutes; history lives in docs/results/


def bench_report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "scripts" / "bench_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    return report


def test_benchmarks_page_matches_its_results(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert bench_report().render_docs() == PAGE.read_text(), (
        "docs/benchmarks.md differs from its template + results: run "
        "`.venv/bin/python scripts/bench_report.py --write-docs`")


def test_benchmarks_page_is_short() -> None:
    lines = len(PAGE.read_text().splitlines())
    assert lines <= MAX_PAGE_LINES, f"docs/benchmarks.md has {lines} lines: keep the newest figure per workload"


def results_read_by_the_template() -> set[str]:
    text = TEMPLATE.read_text()
    names = {n for m in re.finditer(r"^<!-- (?:tables|platform|sweeps): (.+?) -->$", text, re.M) for n in m.group(1).split()}
    return names | set(re.findall(r"J\('([^']+)'\)", text))


def code_on(page: str) -> list[str]:
    """The fenced code blocks' lines and the inline code spans of a Markdown page."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", page, re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", page, flags=re.S | re.M)
    return [line for block in fenced for line in block.splitlines()] + re.findall(r"`([^`]+)`", prose)


def commands_in(result) -> list[str]:
    """The commands a result file records about itself (``command``, ``*_command``, ``commands``)."""
    found = []
    for item in result if isinstance(result, list) else [result]:
        for key, value in item.items() if isinstance(item, dict) else ():
            if key == "command" or key.endswith("_command"):
                found.append(value)
            elif key == "commands" and isinstance(value, dict):
                found += [v for v in value.values() if isinstance(v, str)]
    return found


@pytest.mark.parametrize("name", sorted(results_read_by_the_template()))
def test_every_result_on_the_page_names_its_command(name: str) -> None:
    """Each JSON the page reads is named on it, beside a command that writes it (a code line with its path,
    a shell variable or glob covering it) or the command the JSON records."""
    page, path = PAGE.read_text(), f"docs/results/{name}.json"
    assert (ROOT / path).exists(), f"{path}: missing"
    written = [tok for line in code_on(page) for tok in re.findall(r"docs/results/\S+?\.json", line)]
    by_code = any(fnmatch.fnmatch(path, re.sub(r"\$\{?\w+\}?|MINE", "*", tok)) for tok in written)
    assert path in page or by_code, f"{path} is read by the page but not named on it"
    recorded = commands_in(json.loads((ROOT / path).read_text()))
    assert by_code or any(c in page for c in recorded), (
        f"{path}: no command on the page writes it (a code line naming it, or the command it records)")


def prose_of(template: str) -> str:
    """The template without code, figures computed from results and directives: what is typed by hand."""
    text = re.sub(r"^```[^\n]*\n.*?^```", "", template, flags=re.S | re.M)
    text = re.sub(r"`[^`]+`", "", text)  # before the figures: a figure may sit inside a code span
    return re.sub(r"\{\{.+?\}\}|<!--.*?-->|\(results/[^)]+\)", "", text, flags=re.S)


def test_the_template_types_no_measured_figure() -> None:
    """A number with a measurement's unit in the template's prose is a figure typed by hand; a bound
    (≤ 500 ms) is a setting. Figures come from ``{{...}}`` or a table directive."""
    typed = re.findall(r"(?<![≤≥] )(?<![≤≥\w.,])\d[\d,.]*\s?(?:×(?!\s?\d)|%|tok/s|ms\b|µs\b|GB/s|GFLOP/s)",
                       prose_of(TEMPLATE.read_text()))
    assert not typed, f"figures typed by hand in docs/benchmarks.template.md: {typed}"


# Names of other projects' files, which the docs may mention.
# llama.cpp itself and its HF-to-GGUF converter; nano-vllm's benchmark script
OTHER_PROJECTS = {"llama.cpp", "convert_hf_to_gguf.py", "bench.py"}
MENTION = re.compile(r"(?<![\w./:$\-{}])((?:[\w.-]+/)*(?:\{\w+(?:,\w+)+\}|[\w-]+)\.(?:py|cpp|h|cu|sh))\b")


def tree_files() -> list[str]:
    roots = ["folovllm", "csrc", "scripts", "benchmarks", "tests", "docs"]
    files = [p.relative_to(ROOT).as_posix() for r in roots for p in (ROOT / r).rglob("*") if p.is_file()]
    return files + [p.name for p in ROOT.iterdir() if p.is_file()]


def expand(mention: str) -> list[str]:
    m = re.search(r"\{([^}]*)\}", mention)
    return [mention] if not m else [x for alt in m.group(1).split(",")
                                    for x in expand(mention[:m.start()] + alt + mention[m.end():])]


def comments_and_docstrings(path: Path) -> str:
    """What a source file says in prose: Python's comments and docstrings, C++'s comments."""
    text = path.read_text()
    if path.suffix != ".py":
        return "\n".join(re.findall(r"//[^\n]*|/\*.*?\*/", text, re.S))
    said = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            said.append(ast.get_docstring(node, clean=False) or "")
    return "\n".join(said)


def test_docs_and_comments_name_files_that_exist() -> None:
    """A source file a doc, a comment or a docstring names (``compilation/layer_chain.py``, ``linear.cpp``) is in
    the tree; a file of an earlier commit is written ``REV:path``."""
    files = tree_files()
    sources = [p for r in ("folovllm", "csrc", "scripts", "benchmarks", "tests")
               for p in (ROOT / r).rglob("*") if p.suffix in (".py", ".cpp", ".h", ".cu")]
    texts = [(p, p.read_text()) for p in DOCS] + [(p, comments_and_docstrings(p)) for p in sources]
    missing = set()
    for path, text in texts:
        for mention in MENTION.findall(text):
            for name in expand(mention):
                stem = Path(name).stem
                if name in OTHER_PROJECTS or stem.isupper() or any(f == name or f.endswith("/" + name) for f in files):
                    continue
                missing.add(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, sorted(missing)


def test_docs_ship_no_template_markers() -> None:
    """A ``{{NAME}}`` marker belongs to the template docs/benchmarks.md is generated from, never to a page."""
    left = {(d.name, m) for d in DOCS if d != TEMPLATE for m in re.findall(r"\{\{[A-Z][A-Z0-9_]*\}\}", d.read_text())}
    assert not left, sorted(left)


def test_results_a_page_cites_exist_beside_their_commands() -> None:
    """A docs/results JSON a page names is there, and each command it records is on that page (or a code
    line there writes it): a figure is traced to its result and to how to make it again."""
    wrong = []
    for doc in DOCS:
        if doc in (PAGE, TEMPLATE):  # the generated page has its own test above
            continue
        page = doc.read_text()
        written = {tok for line in code_on(page) for tok in re.findall(r"docs/results/\S+?\.json", line)}
        for name in sorted(set(re.findall(r"results/([\w.-]+)\.json", page))):
            path = ROOT / "docs" / "results" / f"{name}.json"
            if any(c.isupper() for c in name):  # a pattern (gpu-matrix-DEVICE), not a file
                continue
            if not path.exists():
                wrong.append(f"{doc.name}: {path.relative_to(ROOT)} missing")
            elif f"docs/results/{name}.json" not in written:
                wrong += [f"{doc.name}: {name}.json's command {c!r} is not on the page"
                          for c in commands_in(json.loads(path.read_text())) if c not in page]
    assert not wrong, wrong


def test_docs_name_declared_variables() -> None:
    from folovllm import envs

    named = {(p.name, v) for p in DOCS for v in re.findall(r"FOLOVLLM_[A-Z0-9_]*[A-Z0-9](?![A-Z0-9_*])", p.read_text())}
    assert {v for _, v in named} <= set(envs.VARIABLES), sorted(x for x in named if x[1] not in envs.VARIABLES)


def subcommand_options() -> dict[str, set[str]]:
    """`folovllm` subcommands ("bench throughput", "serve", ...) → the flags each takes."""
    import argparse

    from folovllm.entrypoints.cli import build_parser

    found = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        found[prefix] = set(parser._option_string_actions)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    return found


def declares(source: str, flag: str) -> bool:
    """Whether a script declares FLAG: a quoted argparse name, or a pattern of a shell `case`."""
    return f'"{flag}"' in source or re.search(rf"^\s*(\S+\|)?{re.escape(flag)}[)|]", source, re.M) is not None


def test_docs_run_commands_that_exist() -> None:
    """Every `folovllm ...` command in the docs passes only flags its subcommand takes, every script command
    only flags its script declares, every `make` command only targets the Makefile has."""
    options = subcommand_options()
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    wrong = []
    for doc in DOCS:
        for line in code_on(doc.read_text()):
            for command in re.split(r"&&|;|\|", re.sub(r"(^|\s)#.*", "", line)):
                words = [w for w in command.split() if not re.match(r"[A-Z_]+=", w)]  # after VAR=value
                flags = [w.split("=")[0] for w in words if w.startswith("--")]
                program = Path(words[0]).name if words else ""
                if program == "folovllm":
                    sub = " ".join(w for w in words[1:4] if not w.startswith("-"))
                    while sub not in options:
                        sub = sub.rpartition(" ")[0]
                    wrong += [f"{doc.name}: folovllm {sub} {f}" for f in flags if f not in options[sub]]
                if program == "make":
                    wrong += [f"{doc.name}: make {w}" for w in words[1:] if not w.startswith("-") and w not in targets]
                script = words[1] if program in ("python", "python3", "bash") and len(words) > 1 else ""
                if script.startswith(("scripts/", "benchmarks/")) and (ROOT / script).exists():
                    source = (ROOT / script).read_text()
                    wrong += [f"{doc.name}: {script} {f}" for f in flags if not declares(source, f)]
    assert not wrong, wrong


def headings(doc: Path) -> list[str]:
    text = re.sub(r"^```[^\n]*\n.*?^```", "", doc.read_text(), flags=re.S | re.M)
    return [h.strip() for h in re.findall(r"^#+ (.+)$", text, re.M)]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_section_references_point_at_sections() -> None:
    """`docs/X.md, "Section"` in a doc or a comment, and a `X.md#anchor` link, name a heading X has."""
    sources = [p for r in ("folovllm", "scripts", "benchmarks") for p in (ROOT / r).rglob("*.py")]
    broken = []
    for path in DOCS + sources:
        text = path.read_text()
        for name, section in re.findall(r"([\w-]+\.md),? \"([^\"]+)\"", text):
            target = next((d for d in DOCS if d.name == name), None)
            if target and not any(h.startswith(section) for h in headings(target)):
                broken.append(f"{path.relative_to(ROOT)}: {name}, \"{section}\"")
        for link, frag in re.findall(r"\]\(([\w./-]*\.md)#([\w-]+)\)", text):
            target = (path.parent / link).resolve()
            if not target.exists() or frag not in {anchor(h) for h in headings(target)}:
                broken.append(f"{path.relative_to(ROOT)}: {link}#{frag}")
    assert not broken, broken
