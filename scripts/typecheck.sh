#!/usr/bin/env bash
# Type check with mypy (settings: [tool.mypy] in pyproject.toml) of the packages that are clean so far;
# each package joins the list once mypy reports no error in it, and `make lint` runs this script once every
# package of [tool.mypy] packages is here.
#
#   scripts/typecheck.sh [MYPY_ARGS...]      exit code 1 when mypy reports an error
#
# PYTHON (default .venv/bin/python) needs the `dev` extra (mypy).
set -euo pipefail
cd "$(dirname "$0")/.."

CLEAN_PACKAGES=(grpo_runtime tiny_models rollout_service)

args=()
for package in "${CLEAN_PACKAGES[@]}"; do
    args+=(-p "$package")
done
exec "${PYTHON:-.venv/bin/python}" -m mypy "${args[@]}" "$@"
