"""Assembly reasoning probe: spatial and multi-step planning questions rendered from the task's scenes.

Modules: ``scene`` (states, boards, cameras, renderer with a key light and shadows), ``questions`` (11
elementary types, the paper's option counts), ``planning`` (stacked-block domain placed clear on screen,
constraint graph, order checker, legal paths, Plan-k-step), ``prompts`` (the official LEGO-Puzzles prompt
format and the legacy one), ``parsing`` (free-text answers, optional model-assisted extraction),
``answerers`` (oracle, random, OpenAI-compatible HTTP), ``build`` (the set; its identity the sha256 of its
states), ``report`` (Wilson intervals, chance and critical accuracy, Overall, Lite Overall and the paper's three
levels, planning curves, replies cut off), ``caveats`` (what every report says the set is and is not comparable
with), ``gallery``, ``human`` (the human baseline for Lite: a page, an answer sheet, scored by the same code);
Plan-k-Step-Generation: ``genset`` (the set: every valid step state as a reference, the part-level reading
calibrated on correct and wrong-state renders under a generator's changes, scoring, reports), ``matching``
(alignment to the fixed camera: shift and similarity warp; the generator-like changes; MSE), ``partread`` (the
part-level reading, the headline score), ``gendriver`` (multi-turn or single-shot requests to
an image-generating model), ``generation`` (the same scorer for one Plan-k-step item).
CLI: ``python -m assembly_probe build|run|gallery|human-sheet|generate-build|generate-calibrate|generate-answers|
generate-score``. A product of its own beside the benchmark: it imports only ``env`` and ``binomial_stats``, and
nothing of the benchmark imports it (tests/test_layers.py).
"""
