#!/usr/bin/env bash
# Type check with mypy (settings: [tool.mypy] in pyproject.toml) of every package: the three services and
# the libraries beside them. `make lint` runs it, so each stays clean.
#
#   scripts/typecheck.sh [MYPY_ARGS...]      exit code 1 when mypy reports an error
#
# PYTHON (default .venv/bin/python) needs the `dev` extra (mypy).
set -euo pipefail
cd "$(dirname "$0")/.."

CLEAN_PACKAGES=(grpo_runtime tiny_models reward_service rollout_service trainer_service)

args=()
for package in "${CLEAN_PACKAGES[@]}"; do
    args+=(-p "$package")
done
exec "${PYTHON:-.venv/bin/python}" -m mypy "${args[@]}" "$@"
