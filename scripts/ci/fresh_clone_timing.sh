#!/usr/bin/env bash
# usage: scripts/ci/fresh_clone_timing.sh [REPO] [CLONE_DIR]
# Times what a newcomer pays: clone REPO (default: this repo) into CLONE_DIR (default: a new temp dir),
# then install.sh from an EMPTY pip cache (a cached wheel would hide a source build), then the main
# command (run_demo.sh; its install.sh step is then the idempotent check). Prints INSTALL_S, DEMO_RC,
# DEMO_AFTER_INSTALL_S, TOTAL_S. The README's figures: docs/results/fresh_clone/main_command.log.
set -u
REPO=${1:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}
DIR=${2:-$(mktemp -d)/sglang_pd}
git clone -q "$REPO" "$DIR" || exit 1
cd "$DIR" || exit 1
export PIP_CACHE_DIR=$(mktemp -d)
echo "clone $(git log --oneline -1) PIP_CACHE_DIR=$PIP_CACHE_DIR (empty) start $(date -u +%FT%TZ)"
t0=$SECONDS
bash scripts/ci/install.sh || exit 1
echo "INSTALL_S $((SECONDS - t0))"
t1=$SECONDS
bash scripts/ci/run_demo.sh
echo "DEMO_RC $? DEMO_AFTER_INSTALL_S $((SECONDS - t1)) TOTAL_S $((SECONDS - t0)) end $(date -u +%FT%TZ)"
