"""How math-verify extracts and compares an answer: one frozen, picklable record that travels with each job
to the checker worker (see ``worker.check_answer``), and the two presets the ``accuracy`` reward starts from.

Field by field it maps onto math-verify 0.9's own knobs:

* ``targets`` → ``parse(extraction_config=[...])``: ``"latex"`` is a ``LatexExtractionConfig``, ``"expr"`` an
  ``ExprExtractionConfig``, in this order;
* ``try_extract_without_anchor`` → both configs' field of that name (extract without ``\\boxed{}`` or a
  "final answer is" anchor);
* ``boxed_match_priority`` → ``LatexExtractionConfig.boxed_match_priority`` (0 first, 50 after the "answer
  is" patterns, -1 never);
* ``basic_latex`` … ``equations`` → the ``latex2sympy2_extended.NormalizationConfig`` of the LaTeX config
  (``malformed_operators`` repairs ``\\sqrt 2`` and ``\\frac94``);
* ``extraction_mode``, ``fallback_mode`` → ``parse``'s arguments of those names;
* ``gold`` → how the gold answer is parsed: ``"default"`` with ``parse``'s defaults (as TRL), ``"answer"``
  with exactly the answer's extraction (as Math-Verify's own tests do);
* ``float_rounding``, ``numeric_precision``, ``strict``, ``allow_set_relation_comp`` → ``verify``'s
  arguments of those names.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class MathVerifyOptions:
    targets: tuple[str, ...]
    try_extract_without_anchor: bool
    boxed_match_priority: int
    basic_latex: bool
    units: bool
    malformed_operators: bool
    nits: bool
    boxed: str
    equations: bool
    extraction_mode: str
    fallback_mode: str
    gold: str
    float_rounding: int = 6
    numeric_precision: int = 15
    strict: bool = True
    allow_set_relation_comp: bool = False

    def with_overrides(self, overrides: dict[str, Any]) -> MathVerifyOptions:
        """This preset with the given fields replaced (``None`` values keep the preset's)."""
        names = {f.name for f in fields(self)}
        changes = {k: v for k, v in overrides.items() if k in names and v is not None}
        if "targets" in changes:
            changes["targets"] = tuple(changes["targets"])
        return replace(self, **changes)


# TRL 1.16 ``accuracy_reward``: gold with parse()'s defaults; the answer with
# LatexExtractionConfig(normalization_config=NormalizationConfig(units=True), boxed_match_priority=0,
# try_extract_without_anchor=False) and extraction_mode="first_match"; verify's defaults.
TRL = MathVerifyOptions(
    targets=("latex",),
    try_extract_without_anchor=False,
    boxed_match_priority=0,
    basic_latex=True,
    units=True,
    malformed_operators=False,
    nits=False,
    boxed="all",
    equations=False,
    extraction_mode="first_match",
    fallback_mode="first_match",
    gold="default",
)

# math-verify's own defaults: parse(pred) with [LatexExtractionConfig(), ExprExtractionConfig()] and
# extraction_mode="any_match"; the LaTeX config's default NormalizationConfig repairs malformed operators and
# nits; answers need no anchor.
MATH_VERIFY = MathVerifyOptions(
    targets=("latex", "expr"),
    try_extract_without_anchor=True,
    boxed_match_priority=50,
    basic_latex=True,
    units=True,
    malformed_operators=True,
    nits=True,
    boxed="all",
    equations=False,
    extraction_mode="any_match",
    fallback_mode="first_match",
    gold="default",
)

PRESETS = {"trl": TRL, "math_verify": MATH_VERIFY}
