"""Policies of every track behind one interface (:class:`Policy`). Which model builds which policy, with which
options and runtime, is :mod:`eval.request` (the models' configurations)."""

from __future__ import annotations

from eval.policies.base import ACTION_DIM, TRACKS, BadActionError, Policy  # noqa: F401
