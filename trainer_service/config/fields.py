"""Building blocks shared by every block of the run config: the strict base model and finite parameters.

No number anywhere in the config may be NaN or infinite: every float field refuses them
(``allow_inf_nan=False`` on :class:`StrictModel`) and so does every free-form parameter mapping
(:data:`FiniteParams`), so a hostile ``learning_rate: .nan`` never reaches the optimizer.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A config block: unknown keys are errors, assignments are validated, numbers are finite."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def _non_finite_at(value: Any, path: str = "") -> str | None:
    """The dotted path of the first NaN/inf float inside nested dicts and lists, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "value"
    if isinstance(value, dict):
        items = ((f"{path}.{key}" if path else str(key), item) for key, item in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{index}]", item) for index, item in enumerate(value))
    else:
        return None
    for inner_path, item in items:
        found = _non_finite_at(item, inner_path)
        if found is not None:
            return found
    return None


def _all_finite(value: Any) -> Any:
    found = _non_finite_at(value)
    if found is not None:
        raise ValueError(f"holds a non-finite number (NaN or infinity) at {found}")
    return value


# A free-form parameter mapping (reward, variant and backend parameters): any JSON-like value, numbers finite.
FiniteParams = Annotated[dict[str, Any], AfterValidator(_all_finite)]
