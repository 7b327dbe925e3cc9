"""What every report of the probe says about the set it scores: what the set is, what its numbers are not
comparable with, and how far its sample sizes carry (one text for the question reports, the generation reports,
the gallery, the human answer sheet and the docs, so none of them can drift)."""

from __future__ import annotations

WHAT_THE_SET_IS = (
    "What this set is: a stand-in for LEGO-Puzzles (Tang et al. 2025) built on this benchmark's own parts: "
    "rendered boards with shaped holes and coloured blocks with a knob, in the paper's 11 question types and "
    "Plan-k-step, with ground truth read from the scene state. It is not LEGO: its pictures, parts and "
    "difficulty are its own, and no person has been scored on it yet (the human baseline protocol in "
    "docs/reasoning.md states how). Its numbers are therefore not comparable with the paper's table (models or "
    "its human accuracy) or with other LEGO-Puzzles results; compare models on this set with each other only.")

SAMPLE_SIZE = (
    "Sample sizes: 100 questions per type (Lite: 20) and 20 Plan-k-step items per k (Lite: 5). A 95% Wilson "
    "range on 20 questions is about 40 points wide, on 100 about 18: Lite results and single-k planning results "
    "are shown with their Wilson ranges, and ranking models on them is not supported where the ranges overlap.")

SAMPLE_SIZE_GENERATION = (
    "Sample sizes: 20 Plan-k-Step-Generation cases per k (80 in all). A 95% Wilson range on 20 cases is about 40 "
    "points wide: per-k results are shown with their Wilson ranges, and ranking models on them is not supported "
    "where the ranges overlap.")

IDENTITY = ("The set's identity is the sha256 of its states (sha256_states: every question and every state "
            "exactly, the same on every machine); each image's own sha256 is published in the set's manifest "
            "(files), but the identity does not depend on the renderer's pixels.")


def lines(generation: bool = False) -> list[str]:
    """The caveats as Markdown paragraphs (a report's "About this set" section); ``generation``: a
    Plan-k-Step-Generation report (its sample sizes)."""
    return ["## About this set", "", WHAT_THE_SET_IS, "", SAMPLE_SIZE_GENERATION if generation else SAMPLE_SIZE, "",
            IDENTITY, ""]
