"""Assembly reasoning probe: spatial and multi-step planning questions rendered from the task's scenes.

Modules: ``scene`` (states, boards, cameras, renderer), ``questions`` (11 elementary types),
``planning`` (stacked-block domain, constraint graph, order checker, Plan-k-step),
``generation`` (Plan-k-step-Generation scorer for one item), ``genset`` (the Plan-k-Step-Generation
set: every valid step state as a reference, calibrated matching threshold, per-k report),
``parsing`` (free-text answers, optional model-assisted extraction),
``answerers`` (oracle, random, OpenAI-compatible HTTP), ``build`` (set + sha256),
``report`` (Wilson intervals, chance and critical accuracy, planning curves), ``gallery``.
CLI: ``python -m eval.reasoning build|run|gallery|generate-build|generate-answers|generate-score``.
"""
