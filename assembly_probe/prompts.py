"""Prompt styles: how an item becomes the content of one request (text parts and images, in order).

``official`` (the default) follows the LEGO-Puzzles evaluation in VLMEvalKit
(open-compass/VLMEvalKit, ``vlmeval/dataset/image_mcq.py``): ``ImageMCQDataset.build_prompt`` writes
``Question: ...``, then ``Options:`` with one ``X. text`` line per option and the instruction
"Please select the correct answer from the options above."; ``LEGO.build_prompt_sort`` asks the ordering
("sort") items for the sequence of letters instead; ``LEGO.split_LEGO`` puts each image where its
``<image N>`` marker stands (option lines included: an option that is a picture reads ``A. <image 3>``).
No system prompt. Plan-k-step items, which the paper scores the same way, get a sort-like instruction for
their k letters.

``official-cot`` is the official prompt with a chain-of-thought instruction in place of the answer-only one: think
step by step, then end with a line ``Answer: ...`` (the paper reports Next-k-Step with and without CoT; its CoT
wording is not published with VLMEvalKit's LEGO prompt, so this one is this project's). Give such a run room to
think (``--max-tokens``); a reply cut off by the token limit is answered only if it already gave its answer after a marker, and is counted
per type in the report.

``legacy`` is this project's first format: a system prompt asking to think briefly and end with
"Answer: ...", the question with its options inline, then every image after its label.
"""

from __future__ import annotations

import re

STYLES = ("official", "official-cot", "legacy")
DEFAULT_STYLE = "official"
# VLMEvalKit ImageMCQDataset.build_prompt (trailing space and newline as there)
CHOICE_INSTRUCTION = "Please select the correct answer from the options above. \n"
# VLMEvalKit LEGO.build_prompt_sort
SORT_INSTRUCTION = "Please respond with only the sequence of letters (e.g., 'BDAC') that correctly orders the steps.\n"
LEGACY_SYSTEM_PROMPT = ("You answer questions about rendered images of a robot workspace: a table, a board with shaped "
                        "holes and coloured blocks (circle, square, triangle) with a knob on top. Think briefly, then "
                        "end with a line 'Answer: ...' in the requested format.")
_MARKER = re.compile(r"<image (\d+)>")


def plan_instruction(k: int, labels) -> str:
    example = "".join(labels[:k])
    return (f"Please respond with only the sequence of {k} letters (e.g., '{example}') of the states after moves 1 "
            f"to {k}, in the order of the moves.\n")


def _option_text(item, label: str) -> str:
    """An option's text; a picture option names its image's marker."""
    for n, im in enumerate(item["images"], start=1):
        if im["label"] == label and im["role"] in ("candidate", "state"):
            return f"<image {n}>"
    return item["options"][label]


def cot_instruction(item) -> str:
    """The chain-of-thought instruction: reason first, the answer in a fixed form on the last line."""
    if item["answer_format"] == "order":
        form = "the sequence of letters, e.g. 'Answer: BDAC'"
    elif item["answer_format"] == "plan":
        form = f"the sequence of {item['k']} letters, e.g. 'Answer: {''.join(item['labels'][:item['k']])}'"
    else:
        form = "one option's letter, e.g. 'Answer: A'"
    return f"Think step by step about the pictures, then give your final answer on the last line as {form}.\n"


def official_text(item, cot: bool = False) -> str:
    """The whole official prompt as one text, ``<image N>`` markers in place (VLMEvalKit builds the same
    string before splitting it at the markers); ``cot``: the chain-of-thought instruction instead of the
    answer-only one."""
    text = f"Question: {item['question']}\n"
    labels = item["labels"]
    text += "Options:\n" + "".join(f"{lab}. {_option_text(item, lab)}\n" for lab in labels)
    if cot:
        return text + cot_instruction(item)
    if item["answer_format"] == "order":
        return text + SORT_INSTRUCTION
    if item["answer_format"] == "plan":
        return text + plan_instruction(item["k"], labels)
    return text + CHOICE_INSTRUCTION


def parts(item, style: str = DEFAULT_STYLE) -> list[tuple[str, object]]:
    """The request's content in order: ("text", str) and ("image", index into ``item['images']``)."""
    if style == "legacy":
        out: list[tuple[str, object]] = [("text", item["prompt"])]
        for i, im in enumerate(item["images"]):
            out += [("text", f"{im['label']}:"), ("image", i)]
        return out
    if style not in STYLES:
        raise ValueError(f"unknown prompt style {style!r}; valid: {', '.join(STYLES)}")
    text = official_text(item, cot=style == "official-cot")
    out, pos, seen = [], 0, set()
    for m in _MARKER.finditer(text):
        n = int(m.group(1))
        if not 1 <= n <= len(item["images"]):
            raise ValueError(f"{item.get('id')}: <image {n}> but the item has {len(item['images'])} images")
        if text[pos:m.start()]:
            out.append(("text", text[pos:m.start()]))
        out.append(("image", n - 1))
        seen.add(n - 1)
        pos = m.end()
    if text[pos:]:
        out.append(("text", text[pos:]))
    missing = sorted(set(range(len(item["images"]))) - seen)
    if missing:
        raise ValueError(f"{item.get('id')}: images {[i + 1 for i in missing]} have no <image N> marker")
    return out


def text_of(item, style: str) -> str:
    """The prompt's whole text (no images), for a request whose images are tiled after it."""
    return item["prompt"] if style == "legacy" else official_text(item, cot=style == "official-cot")


def system_prompt(style: str) -> str | None:
    return LEGACY_SYSTEM_PROMPT if style == "legacy" else None


def image_names(item, style: str) -> list[str]:
    """What each image is called in the text (for labelled tiles)."""
    if style == "legacy":
        return [im["label"] for im in item["images"]]
    return [f"<image {n}>" for n in range(1, len(item["images"]) + 1)]
