#!/usr/bin/env bash
# Fail when the protos break compatibility with the previous commit (buf's FILE rules, see buf.yaml).
#
# Compares the working tree's protos/ with protos/ at AGAINST_REF (default HEAD~1, the previous
# commit of main). When that commit does not exist (first commit, shallow clone) or has no protos/,
# there is nothing to compare and the check passes.
set -euo pipefail

cd "$(dirname "$0")/.."
BUF="${BUF:-.venv/bin/buf}"
AGAINST_REF="${AGAINST_REF:-HEAD~1}"

if ! git rev-parse --verify --quiet "${AGAINST_REF}^{commit}" >/dev/null; then
    echo "buf breaking: no commit ${AGAINST_REF} (first commit or shallow clone); nothing to compare"
    exit 0
fi
if ! git cat-file -e "${AGAINST_REF}:protos" 2>/dev/null; then
    echo "buf breaking: ${AGAINST_REF} has no protos/; nothing to compare"
    exit 0
fi

"$BUF" breaking protos --against ".git#ref=${AGAINST_REF},subdir=protos"
echo "buf breaking: protos/ compatible with ${AGAINST_REF} ($(git rev-parse --short "${AGAINST_REF}"))"
