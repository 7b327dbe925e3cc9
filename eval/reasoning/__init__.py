"""Assembly reasoning probe: spatial and multi-step planning questions rendered from the task's scenes.

Modules: ``scene`` (states, boards, cameras, renderer with a key light and shadows), ``questions`` (11
elementary types, the paper's option counts), ``planning`` (stacked-block domain placed clear on screen,
constraint graph, order checker, legal paths, Plan-k-step), ``prompts`` (the official LEGO-Puzzles prompt
format and the legacy one), ``parsing`` (free-text answers, optional model-assisted extraction),
``answerers`` (oracle, random, OpenAI-compatible HTTP), ``build`` (set + sha256), ``report`` (Wilson
intervals, chance and critical accuracy, Overall and Lite Overall, planning curves), ``gallery``;
Plan-k-Step-Generation: ``genset`` (the set: every valid step state as a reference, the tolerance calibrated
on perturbed correct and on wrong-state renders, scoring, reports), ``matching`` (alignment to the fixed
camera and MSE), ``partread`` (the part-level verifier), ``gendriver`` (multi-turn or single-shot requests to
an image-generating model), ``generation`` (the same scorer for one Plan-k-step item).
CLI: ``python -m eval.reasoning build|run|gallery|generate-build|generate-calibrate|generate-answers|generate-score``.
"""
