#!/usr/bin/env bash
# Type check with mypy (settings: [tool.mypy] in pyproject.toml) of the packages that are clean so far;
# `make lint` runs it, so a clean package stays clean. A package joins the list once mypy reports no error
# in it (trainer_service: about 150 errors left).
#
#   scripts/typecheck.sh [MYPY_ARGS...]      exit code 1 when mypy reports an error
#
# PYTHON (default .venv/bin/python) needs the `dev` extra (mypy).
set -euo pipefail
cd "$(dirname "$0")/.."

CLEAN_PACKAGES=(grpo_runtime tiny_models reward_service rollout_service)

args=()
for package in "${CLEAN_PACKAGES[@]}"; do
    args+=(-p "$package")
done
exec "${PYTHON:-.venv/bin/python}" -m mypy "${args[@]}" "$@"
