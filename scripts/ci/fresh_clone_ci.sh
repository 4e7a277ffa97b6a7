#!/usr/bin/env bash
# usage: BRANCH=main bash scripts/ci/fresh_clone_ci.sh   -- what CI does, timed: a clean clone of this repo's
# BRANCH into /tmp/ci_clone, an EMPTY pip cache, then `CI=true bash .ci/run`. Output: docs/results/fresh_clone/ci_run.log.
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
rm -rf /tmp/ci_clone && git clone -q -b "${BRANCH:-main}" "$REPO" /tmp/ci_clone && cd /tmp/ci_clone || exit 2
export PIP_CACHE_DIR=$(mktemp -d)
echo "ci clone $(git log --oneline -1) PIP_CACHE_DIR=$PIP_CACHE_DIR (empty) start $(date -u +%FT%TZ)"
t0=$SECONDS
CI=true bash .ci/run
echo "CI_RC $? TOTAL_S $((SECONDS - t0)) end $(date -u +%FT%TZ)"
