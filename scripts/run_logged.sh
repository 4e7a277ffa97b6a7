#!/usr/bin/env bash
# run_logged.sh LOG CMD...: run CMD with its command line, then its output (stdout and stderr), in LOG.
# The measurement scripts under scripts/probes/ use it so that every stored log starts with the command that wrote it.
set -euo pipefail
log=$1; shift
mkdir -p "$(dirname "$log")"
echo "\$ $*" > "$log"
"$@" >> "$log" 2>&1
