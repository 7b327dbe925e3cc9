"""Rule-based parsing of free-text answers: letters, yes/no, option values and letter sequences.

Rules: the text after the last explicit marker ("answer", "final answer", "order",
"sequence", "choice", "option") is read first (lower-case labels allowed there); then the
sentences from last to first; then the whole text. A capital 'A' or 'I' followed by a
lower-case word is an English word, not a label. A segment naming two different letters
(or both yes and no) is ambiguous: unparseable (None), counted wrong by the runner.
"""

from __future__ import annotations

import re

_MARKER = re.compile(
    r"(?i)\b(?:final\s+answer|answer|order|sequence|choice|option)\b(?:\s+(?:is|would\s+be|should\s+be))?\s*[:：\-=]?")
_NOISE = re.compile(r"[*_`\"“”]")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_NUMBERING = re.compile(r"(?i)(?:\bstep\s*)?\b\d+\s*[.):]\s*")


def _segments(text: str) -> list[tuple[str, str]]:
    """(kind, text): 'marker' (after the last marker), then 'sentence's last to first, then 'all'."""
    text = _NOISE.sub(" ", text or "")
    segs = []
    marks = list(_MARKER.finditer(text))
    if marks:
        segs.append(("marker", text[marks[-1].end():].strip()))
    segs += [("sentence", s) for s in reversed(_SENTENCE.split(text)) if s.strip()]
    segs.append(("all", text))
    return segs


# words that follow a label ('A or B', 'A is lower') rather than the article 'A' ('A block ...')
_AFTER_LABEL = {"or", "and", "is", "was", "are", "then", "shows", "has", "looks", "seems", "because", "comes",
                "goes", "first", "last", "next", "before", "after", "to", "with"}


def _tokens(seg: str, labels, lower_ok: bool = False) -> list[str]:
    """Standalone label letters in order, skipping the words 'A' / 'I' before a lower-case word."""
    allowed = "".join(sorted(set(labels)))
    if lower_ok:
        allowed += allowed.lower()
    out = []
    for m in re.finditer(rf"(?<![A-Za-z0-9'])([{allowed}])(?![A-Za-z0-9'])", seg):
        nxt = re.match(r" ([a-z]+)", seg[m.end():m.end() + 12])
        if m.group(1) in "AIai" and nxt and nxt.group(1) not in _AFTER_LABEL:
            continue
        out.append(m.group(1).upper())
    return out


def parse_choice(text: str, labels, options: dict | None = None) -> str | None:
    """One of ``labels``; when no letter is given, an option's value (e.g. '45 degrees') or text."""
    for kind, seg in _segments(text):
        toks = _tokens(seg, labels, lower_ok=kind == "marker")
        if kind == "marker" and toks and re.match(r"\s*[(\[]?\s*" + toks[0] + r"\b", seg, re.I):
            return toks[0]  # 'Answer: B, because A is lower' -> B
        found = set(toks)
        if len(found) == 1:
            return found.pop()
        if len(found) > 1:
            return None
        if options:
            hit = _match_option_text(seg, options)
            if hit:
                return hit
    return None


def _match_option_text(seg: str, options: dict) -> str | None:
    nums = set(re.findall(r"-?\d+(?:\.\d+)?", seg))
    hits = set()
    for lab, txt in options.items():
        val = re.findall(r"-?\d+(?:\.\d+)?", str(txt))
        if (val and val[0] in nums) or (not val and str(txt).lower() in seg.lower()):
            hits.add(lab)
    return hits.pop() if len(hits) == 1 else None


_YES = ("yes", "true", "correct")


def parse_yes_no(text: str) -> str | None:
    for kind, seg in _segments(text):
        words = [w.lower() for w in re.findall(r"(?i)\b(yes|no|true|false|correct|incorrect)\b", seg)]
        if not words:
            continue
        vals = {"yes" if w in _YES else "no" for w in words}
        if len(vals) == 1:
            return vals.pop()
        if re.match(r"(?i)\s*(yes|no)\s*[,.!:;\-]", seg):  # 'No - it is true that they look close' -> no
            return "yes" if words[0] in _YES else "no"
        return None
    return None


def parse_sequence(text: str, labels, k: int) -> list[str] | None:
    """Exactly ``k`` labels in order: 'B, D, A', 'B -> D -> A', '1. B 2. D 3. A', 'BDA', '[B, D, A]'."""
    allowed = "".join(sorted(set(labels)))
    for kind, seg in _segments(text):
        compact = [c for c in re.findall(rf"(?<![A-Za-z])([{allowed}]{{{k}}})(?![A-Za-z])", seg) if len(set(c)) == k]
        if k > 1 and len(compact) == 1:
            return list(compact[0])
        toks = _tokens(_NUMBERING.sub(" ", seg), labels, lower_ok=kind == "marker")
        if len(toks) == k:
            return toks
        if kind == "marker" and len(toks) > k:  # 'Answer: B, D, A. (C is wrong)' -> the first k
            return toks[:k]
    return None


def parse_answer(item: dict, text: str):
    """Dispatch on the item's answer format; None when unparseable."""
    fmt = item["answer_format"]
    if fmt == "choice":
        return parse_choice(text, item["labels"], item.get("options"))
    if fmt == "yesno":
        return parse_yes_no(text)
    if fmt == "order":
        return parse_sequence(text, item["labels"], len(item["labels"]))
    if fmt == "plan":
        return parse_sequence(text, item["labels"], item["k"])
    raise ValueError(f"unknown answer format {fmt!r}")
