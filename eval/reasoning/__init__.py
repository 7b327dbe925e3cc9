"""Assembly reasoning probe: spatial and multi-step planning questions rendered from the task's scenes.

Modules: ``scene`` (states, boards, cameras, renderer), ``questions`` (11 elementary types),
``planning`` (stacked-block domain, constraint graph, order checker, Plan-k-step),
``generation`` (Plan-k-step-Generation scorer), ``parsing`` (free-text answers),
``answerers`` (oracle, random, OpenAI-compatible HTTP), ``build`` (set + sha256),
``report`` (Wilson intervals, chance and critical accuracy, planning curves), ``gallery``.
CLI: ``python -m eval.reasoning build|run|gallery``.
"""
