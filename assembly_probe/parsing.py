"""Rule-based parsing of free-text answers: letters, yes/no, option values and letter sequences.

Where the answer is read (the first place that yields one wins):

1. The *answer line* after an explicit marker, strongest kind first: "final answer" (also "final
   choice/order/sequence"), then "answer", then "order", "sequence", "choice", "option". Within a
   kind the last marker is tried first, then earlier ones. "answer", "order", ... count as markers
   only when followed by ':', '=', '-' or "is / would be / should be" ("Option A is wrong" and
   "In order to be sure" are not markers); "final answer" counts bare. Without ':' ("the answer is")
   the answer line must begin with the answer ("This answer is right because A ..." is no marker). The answer line is the rest
   of the marker's line (or the next non-empty line when the marker ends its line); its first
   sentence is read before the whole line. Order is taken from the answer line only, never from
   later prose ("The order matters: D needs B first").
2. The sentences from last to first; 3. the whole text.

Lower-case labels are allowed on an answer line. A capital 'A' or 'I' followed by a lower-case word
is an English word, not a label. A segment naming two different letters (or both yes and no) is
ambiguous, and so is an answer line that begins with two options joined by "or", "and", ",", "/" or "&"
("Answer: B or C": a hedge names two options, it scores 0): unparseable (None), counted wrong by the runner unless a model-assisted extraction
(``--extract-with``, :func:`extraction_prompt`) is asked for, which is reported separately.
"""

from __future__ import annotations

import re

_NOISE = re.compile(r"[*_`\"“”#]")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_NUMBERING = re.compile(r"(?i)(?:\bstep\s*)?\b\d+\s*[.):]\s*")
_LEAD = r"(?:\s+(?:is|would\s+be|should\s+be|will\s+be))?\s*"
# (strength, pattern): lower strength is tried first
_MARKERS = (
    (0, re.compile(r"(?i)\bfinal\s+(?:answer|choice|order|sequence)\b" + _LEAD + r"[:：\-=]?")),
    (1, re.compile(r"(?i)\banswer\b(?:" + _LEAD + r"[:：\-=]|\s+(?:is|would\s+be|should\s+be|will\s+be)\b\s*)")),
    (2, re.compile(r"(?i)\b(?:order|sequence|choice|option)\b(?:" + _LEAD + r"[:：\-=]|\s+(?:is|would\s+be|should\s+be)\b\s*)")),
)
# a sentence ends at . ! ? after a letter or a closing bracket (not after a digit: '1. B 2. D')
_FIRST_SENTENCE = re.compile(r"(?<=[A-Za-z)\]])[.!?](?:\s|$)")


_STARTS_WITH_ANSWER = re.compile(r"(?i)\s*[(\[]?\s*(?:[A-Z](?![A-Za-z0-9'])|yes\b|no\b|true\b|false\b|-?\d)")


def _answer_line(text: str, end: int) -> str:
    rest = text[end:]
    line, _, after = rest.partition("\n")
    if line.strip():
        return line.strip()
    for nxt in after.split("\n"):
        if nxt.strip():
            return nxt.strip()
    return ""


def _marker_lines(text: str) -> list[str]:
    """Answer lines after the markers, strongest kind first, last occurrence first within a kind."""
    found: list[tuple[int, int, int, bool]] = []  # (strength, -start, end, has a ':' / '=' / '-')
    taken: list[tuple[int, int]] = []
    for strength, pat in _MARKERS:
        for m in pat.finditer(text):
            if any(a <= m.start() < b for a, b in taken):  # 'answer' inside 'final answer'
                continue
            found.append((strength, -m.start(), m.end(), bool(re.search(r"[:：\-=]\s*$", m.group(0)))))
        taken += [(m.start(), m.end()) for m in pat.finditer(text)]
    lines = []
    for _, _, end, punct in sorted(found):
        line = _answer_line(text, end)
        # without ':' ('the answer is ...') the line must start with the answer: not 'This answer is right because A'
        if punct or _STARTS_WITH_ANSWER.match(line):
            lines.append(line)
    return lines


def has_answer_marker(text: str) -> bool:
    """Whether the reply states its answer after an explicit marker ("Answer: ...", "final answer ...")."""
    return bool(_marker_lines(text))


def _segments(text: str) -> list[tuple[str, str]]:
    """(kind, text): 'marker' answer lines (first sentence, then the line), 'sentence's last to first, 'all'."""
    text = _NOISE.sub(" ", text or "")
    segs = []
    for line in _marker_lines(text):
        if not line:
            continue
        first = _FIRST_SENTENCE.split(line, maxsplit=1)[0].strip()
        if first and first != line:
            segs.append(("marker", first))
        segs.append(("marker", line))
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


_JOIN = r"\s*[)\]]?\s*(?:,|/|&|\bor\b|\band\b)\s*[(\[]?\s*"


def parse_choice(text: str, labels, options: dict | None = None) -> str | None:
    """One of ``labels``; when no letter is given, an option's value (e.g. '45 degrees') or text."""
    for kind, seg in _segments(text):
        toks = _tokens(seg, labels, lower_ok=kind == "marker")
        if kind == "marker" and toks and re.match(r"\s*[(\[]?\s*" + toks[0] + r"\b", seg, re.I):
            if len(toks) > 1 and toks[1] != toks[0] and re.match(
                    r"\s*[(\[]?\s*" + toks[0] + _JOIN + toks[1] + r"(?![A-Za-z0-9'])", seg, re.I):
                return None  # 'Answer: B or C': a hedge, no single answer
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
    """Exactly ``k`` labels in order: 'B, D, A', 'B -> D -> A', '1. B 2. D 3. A', 'BDA', '[B, D, A]'.
    With an answer marker, only its answer line is read (never the prose after it)."""
    allowed = "".join(sorted(set(labels)))
    segs = _segments(text)
    if any(kind == "marker" for kind, _ in segs):
        segs = [s for s in segs if s[0] == "marker"]
    for kind, seg in segs:
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
    if fmt == "yesno":  # the word, or the letter of the official prompt's 'A. Yes / B. No'
        word = parse_yes_no(text)
        if word is None and item.get("options"):
            letter = parse_choice(text, item["labels"])
            word = None if letter is None else item["options"][letter].lower()
        return word
    if fmt == "order":
        return parse_sequence(text, item["labels"], len(item["labels"]))
    if fmt == "plan":
        return parse_sequence(text, item["labels"], item["k"])
    raise ValueError(f"unknown answer format {fmt!r}")


def format_hint(item: dict) -> str:
    """What a well-formed answer to ``item`` looks like, for the extraction prompt."""
    fmt = item["answer_format"]
    labels = ", ".join(item.get("labels") or [])
    if fmt == "yesno":
        return "yes or no"
    if fmt == "choice":
        return f"one letter of {labels}"
    if fmt == "order":
        return f"all of {labels}, each once, in order, comma-separated"
    return f"exactly {item['k']} letters of {labels}, in order, comma-separated"


def extraction_prompt(item: dict, reply: str) -> str:
    """Text-only request to a model: pull the final answer out of a reply the rules could not parse."""
    return (f"A model was asked this question:\n\n{item['prompt']}\n\nIts reply was:\n\n{reply}\n\n"
            f"What final answer does the reply give? Answer with {format_hint(item)} only, on one line "
            "starting 'Answer:', or 'Answer: none' if the reply gives no single answer. Do not solve the "
            "question yourself.")
