"""Every command of the README and the guides (docs/*.md) is checked against the code, so no guide can drift.

The commands are the lines of the fenced ```bash / ```sh / ```console blocks (in ``console`` blocks, the lines
that start with ``$``), joined across ``\\`` continuations, comments dropped, split at ``&&``. Each is checked
without running the work:

- ``python -m MODULE args``: the module exists and its own argument parser accepts the arguments: the module's
  ``main(argv)`` is called with ``ArgumentParser.parse_args`` made to stop the moment it has parsed (nothing
  after it runs); ``eval.run`` / ``eval.orin`` / ``eval.serve`` also build the model's typed configuration
  (``eval.request.model_config``: every model option is one the model takes, with a value it accepts), and
  resolve the setups, split and arm. The commands in CHEAP (a few seconds each) are run for real.
- ``make [VAR=value] TARGET``: ``make -n TARGET`` succeeds.
- ``bash SCRIPT args``: the script exists and takes the options given (SCRIPTS says which parser a script hands
  its arguments to, or that it takes none).
- ``pip install -e '.[extras]'``: every extra is one the package declares; ``docker build``: the Dockerfile exists
  and every ``--build-arg`` is one of its ``ARG`` s.
- Commands for other projects' code (EXTERNAL) are only checked not to be this repository's.

Placeholders (HOST:PORT, NAME, DIR, ``a|b`` alternatives, ``[--optional]`` parts, ``...``) are replaced by the
documented examples in PLACEHOLDERS. The README's published numbers must be docs/BENCHMARK.md section 8's text,
its "here" numbers those of results/README.md, its result excerpt the committed report's lines, and every
relative link of README.md and docs/*.md must reach an existing file (and heading).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import io
import itertools
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(bash|sh|console)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)

# documented example values for the placeholders the guides write (applied to the text, in this order)
PLACEHOLDERS = [
    ("ws://HOST:PORT", "ws://127.0.0.1:8000"),
    ("http://HOST:PORT/v1", "http://127.0.0.1:8000/v1"),
    ("http://HOST:8777", "http://127.0.0.1:8777"),
    ("HOST:6379", "127.0.0.1:6379"),
    ("GPU_HOST", "127.0.0.1"),
    ("ws://ORIN:", "ws://127.0.0.1:"),
    ("<version>", "3.0.3"),
]
# a token-sized placeholder, by the flag it follows (None: any flag)
TOKEN_PLACEHOLDERS = {("--profile", "NAME"): "octo-small", (None, "NAME"): "my-model",
                      (None, "DIR"): "build/docs_check_dir", (None, "TEXT"): "insert the red block"}
# `...` after a command: the rest of its arguments; the documented tail that makes it whole
ELLIPSIS = {"eval.run": ["--split", "dev", "--setups", "A01", "--tries", "1", "--out", "runs/docs_check"]}

# scripts: the module whose parser gets the script's arguments ("$@"), or None (it takes none)
SCRIPTS = {
    "benchmarks/device_check.sh": "benchmarks.device_check",
    "scripts/jetson_standin.sh": None,
    ".ci/run": None,
}
# other projects' commands, run in their own repositories or servers (prefix of the command -> whose)
EXTERNAL = {
    "python -m vla_eval.model_servers.": "vla-eval's model servers (PyPI vla-eval, on a GPU machine)",
    "python vla-scripts/deploy.py": "openvla-oft's own server (in its repository)",
    "uv run scripts/serve_policy.py": "openpi's own server (in its repository)",
}
# run for real: each takes a few seconds at most
CHEAP = {
    "python -m eval.remote.profiles",
    "python -m benchmarks.device_check --list",
    "python -m env.tasklist show --split test",
    "python -m jetson.device",
}


@dataclass(frozen=True)
class Command:
    doc: str  # the file, relative to the repo
    line: int  # the line the command starts on
    words: tuple[str, ...]  # as written (continuations joined, comments left out), split as the shell would

    @property
    def text(self) -> str:
        return shlex.join(self.words)

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def _blocks(text: str):
    for m in FENCE.finditer(text):
        first = text.count("\n", 0, m.start(2)) + 1
        yield m.group(1), first, m.group(2).split("\n")


def extract_commands(path: Path) -> list[Command]:
    text = path.read_text()
    out = []
    for lang, first, lines in _blocks(text):
        pending, start = "", 0
        for i, raw in enumerate(lines):
            line = raw.rstrip()
            if not pending:
                if lang == "console":
                    if not line.startswith("$ "):
                        continue
                    line = line[2:]
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                start = first + i
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            whole = " ".join((pending + line).split())
            pending = ""
            words = shlex.split(whole, comments=True)  # comments dropped
            for part in _split_chain(words):
                out.append(Command(str(path.relative_to(ROOT)), start, tuple(part)))
    return out


def _split_chain(words: list[str]) -> list[list[str]]:
    parts, cur = [], []
    for w in words:
        if w in ("&&", ";", "||"):
            parts.append(cur)
            cur = []
        else:
            cur.append(w)
    return [p for p in parts + [cur] if p]


def all_commands() -> list[Command]:
    return [c for doc in DOCS for c in extract_commands(doc)]


COMMANDS = all_commands()


# ------------------------------------------------------------------ placeholders
def substitute(words) -> list[list[str]]:
    """The argv variants a documented command stands for: placeholders replaced, each ``a|b`` alternative
    taken once (the others at their first), ``[--optional ...]`` parts included."""
    if isinstance(words, str):
        words = shlex.split(words)
    prev, optional, filled = None, False, []
    for w in words:
        for old, new in PLACEHOLDERS:
            w = w.replace(old, new)
        if w.startswith("[--"):
            w, optional = w[1:], True
        if optional and w.endswith("]"):
            w, optional = w[:-1], False
        w = TOKEN_PLACEHOLDERS.get((prev, w), TOKEN_PLACEHOLDERS.get((None, w), w))
        filled.append(w)
        prev = w
    alts = [i for i, w in enumerate(filled) if "|" in w and "://" not in w]
    if not alts:
        return [filled]
    variants = []
    for i in alts:
        for choice in filled[i].split("|"):
            v = [w.split("|")[0] if j in alts else w for j, w in enumerate(filled)]
            v[i] = choice
            if v not in variants:
                variants.append(v)
    return variants


# ------------------------------------------------------------------ parsing without running
class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace):
        super().__init__("parsed")
        self.namespace = namespace


@contextlib.contextmanager
def _stop_after_parsing():
    """``ArgumentParser.parse_args`` / a top-level ``parse_known_args`` raise :class:`_Parsed` with the namespace
    once they have parsed: the command's own parser runs, nothing after it does."""
    orig_args, orig_known = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    depth = [0]

    def parse_args(self, args=None, namespace=None):
        depth[0] += 1
        try:
            ns = orig_args(self, args, namespace)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            raise _Parsed(ns)
        return ns

    def parse_known_args(self, args=None, namespace=None):
        depth[0] += 1
        try:
            res = orig_known(self, args, namespace)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            raise _Parsed(res[0])
        return res

    argparse.ArgumentParser.parse_args = parse_args
    argparse.ArgumentParser.parse_known_args = parse_known_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = orig_args
        argparse.ArgumentParser.parse_known_args = orig_known


def _main_of(module: str):
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"no module {module}"
    mod = importlib.import_module(module)
    if not hasattr(mod, "main") and spec.submodule_search_locations is not None:
        mod = importlib.import_module(module + ".__main__")
    assert hasattr(mod, "main"), f"{module} has no main()"
    return mod.main


def parse(module: str, argv: list[str]) -> argparse.Namespace:
    """The namespace ``python -m module *argv`` parses to; AssertionError with the parser's message if it
    refuses them."""
    main = _main_of(module)
    err = io.StringIO()
    old_argv = sys.argv
    sys.argv = [f"python -m {module}", *argv]
    try:
        with _stop_after_parsing(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if inspect.signature(main).parameters:
                main(list(argv))
            else:
                main()
    except _Parsed as p:
        return p.namespace
    except SystemExit as e:
        raise AssertionError(f"python -m {module} refused {shlex.join(argv)} (exit {e.code}): "
                             f"{err.getvalue().strip()}") from None
    finally:
        sys.argv = old_argv
    raise AssertionError(f"python -m {module}: main() returned without parsing its arguments")


def check_run_args(module: str, ns: argparse.Namespace) -> None:
    """eval.run / eval.orin: the model's typed configuration is built from the options given, and the setups,
    split and arm are the benchmark's (what eval.run.request_from_args checks before resolving a runtime)."""
    from env.arms import ARMS
    from env.setups import resolve_setups
    from env.starts import SPLITS
    from eval.request import model_config, options_from_args

    if ":" not in ns.model:
        model_config(ns.model, **options_from_args(ns))
    assert resolve_setups(ns.setups), ns.setups
    assert ns.split in SPLITS, f"unknown split {ns.split}"
    assert ns.arm in ARMS, f"unknown arm {ns.arm}"


def check_serve_args(ns: argparse.Namespace) -> None:
    from eval.request import model_config, options_from_args
    from eval.serve import check_exposure, check_served_protocol, servable

    assert ns.model in servable(), f"{ns.model} is not servable: {servable()}"
    check_served_protocol(ns.protocol)
    check_exposure(ns.host, ns.token, ns.insecure)
    model_config(ns.model, **options_from_args(ns, servable()))


# ------------------------------------------------------------------ one checker per kind of command
def _strip_env(words: list[str]) -> list[str]:
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    return words


def _python_module(words: list[str]) -> tuple[str, list[str]] | None:
    if words[0] in ("python", "python3", ".venv/bin/python") and len(words) > 2 and words[1] == "-m":
        return words[2], words[3:]
    return None


def check_python_module(module: str, argv: list[str]) -> None:
    if "..." in argv:
        assert module in ELLIPSIS, f"`...` after python -m {module}: add its documented tail to ELLIPSIS"
        argv = [a for a in argv if a != "..."]
        argv += [a for a in ELLIPSIS[module] if a not in argv or not a.startswith("--")]
    if module == "mani_skill.utils.download_asset":
        check_mani_skill_download(argv)
        return
    if module == "pytest":
        check_pytest(argv)
        return
    top = module.split(".")[0]
    assert (ROOT / top / "__init__.py").is_file() or (ROOT / f"{top}.py").is_file(), \
        f"{module} is not this repository's module (add it to EXTERNAL if it is another project's)"
    ns = parse(module, argv)
    if module in ("eval.run", "eval.orin"):
        check_run_args(module, ns)
    elif module == "eval.serve":
        check_serve_args(ns)


def check_mani_skill_download(argv: list[str]) -> None:
    """ManiSkill's asset download (its module imports the whole simulator: not imported here): installed, and
    the command is the one the runner itself tells users to run for that arm (env.arms)."""
    from env.arms import ARMS

    spec = importlib.util.find_spec("mani_skill")
    assert spec is not None and spec.submodule_search_locations, "mani-skill is not installed"
    assert any((Path(p) / "utils" / "download_asset.py").is_file() for p in spec.submodule_search_locations)
    wanted = {a.download_command for a in ARMS.values() if getattr(a, "download_command", None)}
    assert shlex.join(["python", "-m", "mani_skill.utils.download_asset", *argv]) in wanted, wanted


def check_pytest(argv: list[str]) -> None:
    """pytest (not run from here): the files it is given exist, and a -m expression names declared markers."""
    ini = (ROOT / "pytest.ini").read_text()
    markers = set(re.findall(r"^\s+(\w+):", ini[ini.index("markers"):], re.M))
    it = iter(argv)
    for a in it:
        if a == "-m":
            names = set(re.findall(r"\w+", next(it))) - {"and", "or", "not"}
            assert names <= markers, f"undeclared markers {sorted(names - markers)}; pytest.ini: {sorted(markers)}"
        elif not a.startswith("-"):
            assert (ROOT / a.split("::")[0]).exists(), f"no test file {a}"


def check_make(words: list[str]) -> None:
    variables = [w for w in words[1:] if "=" in w]
    targets = [w for w in words[1:] if "=" not in w]
    assert targets, "make without a target"
    for t in targets:
        r = subprocess.run(["make", "-n", t, *variables], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"make -n {t}: {r.stderr.strip()}"


def check_script(script: str, argv: list[str]) -> None:
    assert (ROOT / script).is_file(), f"no script {script}"
    assert script in SCRIPTS, f"{script}: say in SCRIPTS which parser its arguments go to"
    target = SCRIPTS[script]
    if target is None:
        assert not argv, f"{script} takes no arguments, given {argv}"
    else:
        parse(target, argv)


def check_pip(words: list[str]) -> None:
    assert words[1] == "install", words
    extras = set(importlib.metadata.metadata("shape-assembly-bench").get_all("Provides-Extra") or [])
    for w in words[2:]:
        m = re.fullmatch(r"\.\[([a-z0-9_,-]+)\]", w)
        if m:
            unknown = set(m.group(1).split(",")) - extras
            assert not unknown, f"no extra {sorted(unknown)}; declared: {sorted(extras)}"


def check_docker(words: list[str]) -> None:
    assert words[1] == "build", words
    dockerfile = words[words.index("-f") + 1]
    text = (ROOT / dockerfile).read_text()
    declared = set(re.findall(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)", text, re.M))
    for i, w in enumerate(words):
        if w == "--build-arg":
            name = words[i + 1].split("=")[0]
            assert name in declared, f"{dockerfile} has no ARG {name}"


def check_command(words) -> None:
    if isinstance(words, str):
        words = shlex.split(words)
    text = shlex.join(words)
    for ext in EXTERNAL:
        if text.startswith(ext):
            first = shlex.split(text)[1 if text.startswith("python ") else 2]
            assert not (ROOT / first).exists(), f"{first} is in this repository: not external"
            return
    for argv_words in substitute(words):
        words = _strip_env(argv_words)
        assert words, text
        if (mod := _python_module(words)) is not None:
            check_python_module(*mod)
        elif words[0] == "make":
            check_make(words)
        elif words[0] == "bash":
            check_script(words[1], words[2:])
        elif words[0] in SCRIPTS:
            check_script(words[0], words[1:])
        elif words[0] in ("pip", ".venv/bin/pip") or words[:3] == ["python", "-m", "pip"]:
            check_pip(words if words[0] != "python" else words[2:])
        elif words[0] == "docker":
            check_docker(words)
        else:
            raise AssertionError(f"no check for this command (python -m, make, bash, pip, docker): {text}")


# ------------------------------------------------------------------ the tests
def test_the_docs_have_commands_of_every_kind():
    texts = [c.text for c in COMMANDS]
    assert len(COMMANDS) > 60, len(COMMANDS)
    assert "make demo" in texts and "make test" in texts
    assert "make engines" in texts and any(t.startswith("python -m eval.orin --model octo-small") for t in texts)
    assert {c.doc for c in COMMANDS} >= {"README.md", "docs/jetson.md", "docs/servers.md", "docs/engines.md",
                                         "docs/reasoning.md", "docs/results-page.md", "docs/development.md"}
    assert any(t.startswith("bash benchmarks/device_check.sh --dry-run") for t in texts)


def test_extraction_joins_continuations_splits_chains_and_drops_comments(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("text\n\n```bash\nmake a && python -m m --x 1 \\\n    --y 2   # note\n# only a comment\n```\n\n"
                   "```console\n$ make b\noutput line\n```\n\n```python\nnot = 'a command'\n```\n")
    old = ROOT
    try:
        globals()["ROOT"] = tmp_path
        got = [(c.line, c.text) for c in extract_commands(doc)]
    finally:
        globals()["ROOT"] = old
    assert got == [(4, "make a"), (4, "python -m m --x 1 --y 2"), (10, "make b")]


def test_placeholders_and_alternatives():
    v = substitute("python -m eval.run --model remote --server ws://HOST:PORT --protocol openpi|vla-eval "
                   "--profile NAME [--lite]")
    assert [w for w in v[0] if w.startswith("ws://")] == ["ws://127.0.0.1:8000"]
    assert {x[x.index("--protocol") + 1] for x in v} == {"openpi", "vla-eval"}
    assert all(x[x.index("--profile") + 1] == "octo-small" and "--lite" in x for x in v)


def test_a_wrong_option_is_caught():
    with pytest.raises(AssertionError, match="refused"):
        check_command("python -m assembly_probe run --answerer oracle --no-such-option")
    with pytest.raises(Exception, match="takes no"):
        check_command("python -m eval.run --model scripted --checkpoint x --out runs/x")
    with pytest.raises(AssertionError, match="make -n"):
        check_command("make no-such-target")
    with pytest.raises(AssertionError, match="no script"):
        check_command("bash scripts/no_such_script.sh")
    with pytest.raises(AssertionError, match="refused"):
        check_command("bash benchmarks/device_check.sh --no-such-option")
    with pytest.raises(ValueError, match="not --protocol openpi"):
        check_command("python -m eval.run --model remote --server ws://127.0.0.1:8000 --protocol openpi "
                      "--profile openvla-7b --out runs/x")
    with pytest.raises(AssertionError, match="not servable"):
        check_command("python -m eval.serve --model scripted")
    with pytest.raises(AssertionError, match="unknown split"):
        check_command("python -m eval.orin --model bc-state --split nope --out runs/x")
    with pytest.raises(AssertionError, match="no ARG"):
        check_command("docker build -f Dockerfile.l4t --build-arg NO_SUCH_ARG=1 .")
    with pytest.raises(AssertionError, match="no extra"):
        check_command("pip install -e .[no-such-extra]")
    with pytest.raises(AssertionError, match="undeclared markers"):
        check_command("python -m pytest -m 'not fast'")
    with pytest.raises(AssertionError, match="not this repository's"):
        check_command("python -m json.tool")


@pytest.mark.parametrize("cmd", COMMANDS, ids=[f"{c.doc}:{c.line}" for c in COMMANDS])
def test_documented_command(cmd: Command):
    try:
        check_command(cmd.words)
    except AssertionError as e:
        raise AssertionError(f"{cmd}\n{e}") from None
    except Exception as e:  # noqa: BLE001 - a configuration the code refuses: name the line
        raise AssertionError(f"{cmd}\n{type(e).__name__}: {e}") from None


@pytest.mark.parametrize("text", sorted(CHEAP))
def test_cheap_command_runs(text):
    assert any(c.text == text for c in COMMANDS), f"not in the docs any more: {text}"
    words = shlex.split(text)
    r = subprocess.run([sys.executable, *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{text}: exit {r.returncode}\n{r.stderr[-2000:]}"
    assert r.stdout.strip(), text


def test_profiles_table_is_the_one_the_command_prints():
    from eval.remote.profiles import markdown_table

    assert markdown_table() in (ROOT / "docs" / "servers.md").read_text()


# ------------------------------------------------------------------ the README's numbers and excerpt
def _norm(s: str) -> str:
    return " ".join(s.split())


def _section8() -> str:
    spec = (ROOT / "docs" / "BENCHMARK.md").read_text()
    start = spec.index("## 8. Published reference results")
    return _norm(spec[start:spec.index("\n## 9.", start)])


def _readme_table(heading: str) -> tuple[list[str], list[list[str]]]:
    text = (ROOT / "README.md").read_text()
    lines = text[text.index(f"## {heading}\n"):].split("\n")
    first = next(i for i, l in enumerate(lines) if l.startswith("|"))
    rows = list(itertools.takewhile(lambda l: l.startswith("|"), lines[first:]))
    table = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    return table[0], [r for r in table[2:]]


def test_readme_published_numbers_are_quoted_verbatim_from_the_spec():
    head, rows = _readme_table("Published and here")
    s8 = _section8()
    pub_cols = [i for i, h in enumerate(head) if "published" in h]
    assert len(pub_cols) == 2 and {r[0] for r in rows} >= {"scripted", "bc-state", "octo-small-1.5", "random"}
    for r in rows:
        for i in pub_cols:
            if r[i] != "-":
                assert _norm(r[i]) in s8, f"{r[0]}: {r[i]!r} is not in docs/BENCHMARK.md section 8"
        name = r[0].replace("-1.5", "")
        assert f"{name} {r[pub_cols[0]].split()[0]}" in s8 or f"{r[0]} {r[pub_cols[0]].split()[0]}" in s8 \
            or (name in ("random", "hold") and f"random and hold {r[pub_cols[0]]}" in s8), r


def test_readme_numbers_here_are_those_of_results_readme():
    head, rows = _readme_table("Published and here")
    results = (ROOT / "results" / "README.md").read_text().split("\n")
    here_cols = [i for i, h in enumerate(head) if "here" in h and "published" not in h]
    assert len(here_cols) == 2
    for r in rows:
        line = next((l for l in results if l.startswith(f"| {r[0]} (v2) |")), None)
        cells = [r[i] for i in here_cols if r[i] != "-" and not r[i].startswith("not run here")]
        if not cells:
            continue
        assert line is not None, f"results/README.md has no test-split row for {r[0]}"
        for cell in cells:
            for num in re.findall(r"\d+(?:\.\d+)?(?:/\d+)?", cell):
                assert re.search(rf"(?<![\d.]){re.escape(num)}(?![\d.])", line), f"{r[0]}: {num} not in {line}"


def test_readme_result_excerpt_is_the_committed_report():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- excerpt: (\S+) -->\n(.*?)<!-- /excerpt -->", text, re.S)
    assert m, "the README's result excerpt is marked <!-- excerpt: FILE --> ... <!-- /excerpt -->"
    report = (ROOT / m.group(1)).read_text().split("\n")
    lines = [l for l in m.group(2).split("\n") if l.strip()]
    assert len(lines) >= 4
    missing = [l for l in lines if l not in report]
    assert not missing, missing


def test_readme_stays_a_front_page():
    assert len((ROOT / "README.md").read_text().split("\n")) <= 200


# ------------------------------------------------------------------ links
def _slug(heading: str) -> str:
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_relative_links_resolve(doc: Path):
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor}")
    assert not bad, bad


def test_every_guide_is_listed_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    for doc in DOCS[1:]:
        assert f"](docs/{doc.name})" in readme, f"README's guide table does not list docs/{doc.name}"
