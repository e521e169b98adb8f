"""JSON-schema validation of a completion against a sample's own schema (``jsonschema`` library): the code
that runs in a checker worker process (``check_json_schema``, a pool job) for the ``json_schema`` reward."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from reward_service.core.types import ComponentResult

_FENCED_JSON = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)
# The seed's partial-credit check compares primitive JSON types only.
_PRIMITIVE: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}


def extract_json(text: str) -> Any:
    """The last fenced ``json`` block, else the whole stripped text, decoded; raises ValueError."""
    blocks = _FENCED_JSON.findall(text)
    return json.loads(blocks[-1] if blocks else text.strip())


def _type_matches(value: Any, expected: Any) -> bool:
    if expected is None:
        return True
    names = expected if isinstance(expected, list) else [expected]
    for name in names:
        kind = _PRIMITIVE.get(name)
        if kind is None:
            return True
        # bool is an int in Python but not a JSON number.
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if isinstance(value, kind):
            return True
    return False


def partial_credit(instance: Any, schema: dict[str, Any]) -> float:
    """Seed ``verifiable``/``json_schema``: fraction of the schema's top-level ``required`` fields present
    with the right primitive type; 1.0 when valid JSON and nothing is required, 0.0 when the JSON is not an
    object."""
    required = schema.get("required") or []
    if not isinstance(instance, dict):
        return 0.0
    if not required:
        return 1.0
    properties = schema.get("properties") or {}
    ok = sum(
        1
        for name in required
        if name in instance and _type_matches(instance[name], (properties.get(name) or {}).get("type"))
    )
    return ok / len(required)


def load_schema(raw: Any) -> dict[str, Any]:
    schema = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(schema, dict):
        raise ValueError("metadata 'schema' must be a JSON object (or its text)")
    jsonschema.validators.validator_for(schema).check_schema(schema)
    return schema


def check_completion(raw_schema: Any, completion: str, partial: bool) -> ComponentResult:
    """One sample's result: the schema (dict or JSON text) checked, the completion's JSON validated.

    CPU-unbounded on hostile input (the schema's ``pattern``s are user regexes run by ``re``), so the
    reward runs it in a checker worker process under a hard deadline (``pool``). ``format`` is
    an annotation only (no format checker), as jsonschema's default.
    """
    try:
        schema = load_schema(raw_schema)
    except (ValueError, SchemaError) as exc:
        return ComponentResult(error=f"metadata 'schema' is not a valid JSON schema: {str(exc)[:200]}")
    try:
        instance = extract_json(completion)
    except ValueError as exc:
        return ComponentResult(value=0.0, error=f"completion is not valid JSON: {str(exc)[:200]}")
    except RecursionError:
        return ComponentResult(value=0.0, error="completion is not valid JSON: nested too deeply")
    if partial:
        return ComponentResult(value=partial_credit(instance, schema))
    validator = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    if error is None:
        return ComponentResult(value=1.0)
    where = "/".join(str(p) for p in error.absolute_path)[:200] or "(root)"
    return ComponentResult(value=0.0, error=f"schema violation at {where}: {error.message[:200]}")


def check_json_schema(schema: Any, completion: str, partial: bool) -> tuple[float | None, str]:
    """One JSON-schema job, ``(value, error)``: see ``check_completion``."""
    result = check_completion(schema, completion, partial)
    return result.value, result.error
