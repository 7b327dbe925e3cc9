"""The benchmark's own text (docs/BENCHMARK.md) for the results page: its numbered sections, and the small
part of Markdown it is written in turned into HTML.

The page shows the spec's sections as they are written (the task, the setups table, scoring, splits, tracks,
known limits) and quotes section 8's published numbers from it (:mod:`eval.site.published`): nothing of it is
retyped. The setups table is checked against :data:`env.setups.SETUPS` (the code's setups) when it is read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape
from pathlib import Path

from env.setups import SCORED_IDS, SETUPS
from eval.site.runs import SiteError

SPEC_FILE = Path(__file__).resolve().parents[2] / "docs" / "BENCHMARK.md"
_HEADING = re.compile(r"^## (\d+)\. (.+)$", re.M)


class SpecError(SiteError):
    """The spec file cannot be read or does not say what the page quotes (one line naming the file)."""


@dataclass(frozen=True)
class Section:
    number: str
    title: str
    body: str  # the Markdown below the heading, up to the next numbered section


@dataclass(frozen=True)
class Spec:
    path: Path
    title: str
    sections: dict[str, Section]

    def section(self, number: str) -> Section:
        if number not in self.sections:
            raise SpecError(f"{self.path}: no section '## {number}. ...' (the page quotes it)")
        return self.sections[number]


def read_spec(path: str | Path = SPEC_FILE) -> Spec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"{path}: cannot read the benchmark spec ({e.strerror or e}); pass --spec FILE") from None
    title = next((ln[2:].strip() for ln in text.splitlines() if ln.startswith("# ")), path.name)
    heads = list(_HEADING.finditer(text))
    if not heads:
        raise SpecError(f"{path}: no numbered sections ('## 1. ...'): not the benchmark spec")
    sections = {}
    for i, m in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        sections[m.group(1)] = Section(m.group(1), m.group(2).strip(), text[m.end():end].strip("\n"))
    return Spec(path, title, sections)


def tables(body: str) -> list[list[list[str]]]:
    """The Markdown tables of a text, each as rows of cells (header first, the --- line left out)."""
    out: list[list[list[str]]] = []
    cur: list[list[str]] = []
    for ln in body.splitlines() + [""]:
        if ln.startswith("|"):
            cells = [c.strip() for c in ln.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                cur.append(cells)
        elif cur:
            out.append(cur)
            cur = []
    return out


def setups_table(spec: Spec) -> list[dict[str, str]]:
    """Section 2's table (Id, Name, Group, Difficulty, Change from A01), checked row by row against the
    code's setups: a spec and a code that disagree are an error, never a page that shows one of them."""
    sec = spec.section("2")
    tabs = [t for t in tables(sec.body) if t and t[0][:1] == ["Id"]]
    if not tabs:
        raise SpecError(f"{spec.path}: section 2 has no setups table (| Id | Name | Group | Difficulty | ...)")
    head, *rows = tabs[0]
    out = [dict(zip(head, r)) for r in rows]
    ids = [r.get("Id") for r in out]
    if ids != list(SCORED_IDS):
        raise SpecError(f"{spec.path}: section 2 lists setups {', '.join(map(str, ids))}, the code has "
                        f"{', '.join(SCORED_IDS)}")
    for r in out:
        st = SETUPS[r["Id"]]
        spec_row = (r.get("Name"), r.get("Group"), r.get("Difficulty"))
        if spec_row != (st.name, st.group, st.difficulty):
            raise SpecError(f"{spec.path}: section 2 row {r['Id']} says {spec_row}, env/setups.py says "
                            f"{(st.name, st.group, st.difficulty)}")
    return out


# --------------------------------------------------------------------------
# The Markdown of the spec, as HTML (headings, paragraphs, lists, tables, `code`, **bold**)
# --------------------------------------------------------------------------
def inline_html(text: str) -> str:
    out = escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def _table_html(rows: list[list[str]]) -> str:
    head, *body = rows
    h = "".join(f"<th class=l>{inline_html(c)}</th>" for c in head)
    b = "".join("<tr>" + "".join(f"<td class=l>{inline_html(c)}</td>" for c in r) + "</tr>" for r in body)
    return f'<div class="scroll"><table class="spec"><tr>{h}</tr>{b}</table></div>'


def markdown_html(body: str, heading_level: int = 3) -> str:
    """The spec's Markdown as HTML: '### ' headings, paragraphs, '- ' and '1. ' lists (continuation lines
    indented), tables; inline `code` and **bold**. Enough for docs/BENCHMARK.md, not a general renderer."""
    out: list[str] = []
    para: list[str] = []
    items: list[list[str]] = []
    kind = ""  # "ul" | "ol" while a list is open
    table: list[list[str]] = []

    def flush():
        nonlocal kind, para, items, table
        if para:
            out.append(f"<p>{inline_html(' '.join(para))}</p>")
        if items:
            out.append(f"<{kind}>" + "".join(f"<li>{inline_html(' '.join(i))}</li>" for i in items) + f"</{kind}>")
        if table:
            out.append(_table_html(tables("\n".join("|" + "|".join(r) + "|" for r in table))[0]))
        para, items, table, kind = [], [], [], ""

    for ln in body.splitlines():
        s = ln.strip()
        m_ul, m_ol = re.match(r"^- (.*)", ln), re.match(r"^\d+\. (.*)", ln)
        if not s:
            flush()
        elif ln.startswith("#"):
            flush()
            level = min(6, heading_level + len(ln) - len(ln.lstrip("#")) - 3)
            out.append(f"<h{level}>{inline_html(ln.lstrip('#').strip())}</h{level}>")
        elif s.startswith("|"):
            if para or items:
                flush()
            table.append([c.strip() for c in s.strip("|").split("|")])
        elif m_ul or m_ol:
            new = "ul" if m_ul else "ol"
            if para or table or (kind and kind != new):
                flush()
            kind = new
            items.append([(m_ul or m_ol).group(1)])
        elif items and ln.startswith(" "):
            items[-1].append(s)
        else:
            if items or table:
                flush()
            para.append(s)
    flush()
    return "".join(out)


__all__ = ["SPEC_FILE", "Spec", "Section", "SpecError", "read_spec", "tables", "setups_table", "markdown_html",
           "inline_html"]
