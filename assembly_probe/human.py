"""The human baseline protocol for Lite: an answer sheet a person fills from a page of the Lite questions, scored
by the same code as a model (``run --answerer sheet``).

``human-sheet`` writes, for a built set, ``DIR/README.md`` (every Lite item as a composite picture: the question in
the official prompt, the options, each picture under its ``<image N>``; no answer shown) and ``DIR/answers.csv``
(one row per item: ``id``, ``type``, ``format`` and an empty ``answer`` column; its first line names the set's
``sha256_states``). The person writes, for each row, the option's letter (``B``), or the letters in order for an
ordering or Plan-k-step item (``BDAC``), and nothing else; a row left empty counts wrong and is reported as
unanswered. ``run --answerer sheet --sheet DIR/answers.csv --lite`` reads the sheet (refused, one line naming the
file and its line, when it belongs to another set, names an unknown or repeated item, or lacks its header) and
scores it exactly as a model's replies (the same parser, tables, intervals and levels).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

SHEET_FILE = "answers.csv"
PAGE = "README.md"
COLUMNS = ["id", "type", "format", "answer"]
HEADER_PREFIX = "# assembly_probe answer sheet; set sha256_states "


class SheetError(RuntimeError):
    """A sheet that cannot be scored: one line from the CLI."""


def _format(item) -> str:
    if item["answer_format"] == "order":
        return "letters in order"
    if item["answer_format"] == "plan":
        return f"{item['k']} letters in order"
    return "one letter"


def write_sheet(items, manifest: dict, data_dir, out, tile: int = 224) -> tuple[Path, Path]:
    """The page and the blank sheet for the Lite items of a built set (its images read from ``data_dir``)."""
    from assembly_probe import caveats
    from assembly_probe.gallery import composite

    lite = [it for it in items if it["lite"]]
    if not lite:
        raise SheetError(f"the set in {data_dir} has no Lite items")
    out = Path(out)
    (out / "img").mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    buf.write(HEADER_PREFIX + f"{manifest['sha256_states']}\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    lines = ["# Assembly reasoning probe: the human answer sheet (Lite)", "",
             f"{len(lite)} questions (set sha256_states `{manifest['sha256_states']}`). For each, write in "
             f"`{SHEET_FILE}` beside this page, in the row of its id, the option's letter (`B`), or for an ordering "
             "or Plan-k-step question the letters in order (`BDAC`), and nothing else. Work alone, without tools, "
             "in any order; leave a row empty rather than guess when you have to stop (it counts wrong). Note the "
             "time you took. Then score it: "
             "`python -m assembly_probe run --answerer sheet --sheet answers.csv --data DATA --lite --out DIR`.", "",
             caveats.WHAT_THE_SET_IS, ""]
    for it in lite:
        w.writerow([it["id"], it["type"], _format(it), ""])
        path = out / "img" / f"{it['id']}.png"
        composite(it, data_dir, tile, show_answer=False).save(path, optimize=True)
        lines += [f"**{it['id']}** ({_format(it)})", "", f"![{it['id']}](img/{path.name})", ""]
    (out / SHEET_FILE).write_text(buf.getvalue())
    (out / PAGE).write_text("\n".join(lines))
    return out / PAGE, out / SHEET_FILE


def read_sheet(path, items, manifest: dict) -> dict[str, str]:
    """{item id: the answer written} from a filled sheet of this set (SheetError, naming the file and line)."""
    path = Path(path)
    if not path.is_file():
        raise SheetError(f"--sheet {path} is not a file (make one with: python -m assembly_probe human-sheet)")
    text = path.read_text(errors="replace")
    first, _, rest = text.partition("\n")
    if not first.startswith(HEADER_PREFIX):
        raise SheetError(f"{path} line 1 is not the sheet's header ({HEADER_PREFIX.strip()} ...): write a new sheet "
                         "with python -m assembly_probe human-sheet")
    want = first[len(HEADER_PREFIX):].strip()
    if want != manifest.get("sha256_states"):
        raise SheetError(f"{path} is a sheet of set sha256_states {want[:12]}..., not of this set "
                         f"({str(manifest.get('sha256_states'))[:12]}...): score it against the set it was written for")
    reader = csv.reader(io.StringIO(rest))
    header = next(reader, None)
    if header != COLUMNS:
        raise SheetError(f"{path} line 2 must be the columns {','.join(COLUMNS)}, got {','.join(header or [])!r}")
    known = {it["id"] for it in items}
    answers: dict[str, str] = {}
    for n, row in enumerate(reader, start=3):
        if not row:
            continue
        if len(row) != len(COLUMNS):
            raise SheetError(f"{path} line {n} has {len(row)} fields, not {len(COLUMNS)} ({','.join(COLUMNS)})")
        iid, answer = row[0].strip(), row[3].strip()
        if iid not in known:
            raise SheetError(f"{path} line {n}: no item {iid!r} in this set")
        if iid in answers:
            raise SheetError(f"{path} line {n}: item {iid!r} appears twice")
        answers[iid] = answer
    return answers


class SheetAnswerer:
    """A person's filled sheet behind the answerer interface: the written answer of an item, as a reply."""

    name = "sheet"

    def __init__(self, path, items, manifest: dict):
        self.path = str(path)
        self.answers = read_sheet(path, items, manifest)

    def describe(self) -> dict:
        return {"name": self.name, "sheet": self.path, "rows": len(self.answers),
                "unanswered": sum(not a for a in self.answers.values())}

    def answer(self, item, data_dir=None) -> str:
        return self.answers.get(item["id"], "")
