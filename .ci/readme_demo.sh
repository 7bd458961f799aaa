#!/usr/bin/env bash
# Runs the README's first command on a fresh copy of the repository, in a fresh virtual
# environment, with no DSN (so on the embedded PostgreSQL), headless for a few seconds.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cmd="$(grep -m1 -E "^python3 -m venv .venv && .*jobtui demo$" "$root/README.md")"
if [ -z "$cmd" ]; then
    echo "README's main command not found" >&2
    exit 1
fi
work="$(mktemp -d /tmp/jobtui-readme-XXXXXX)"
trap 'rm -rf "$work"' EXIT
git -C "$root" ls-files -z | (cd "$root" && xargs -0 cp --parents -t "$work")
cd "$work"
export JOBTUI_DATA_DIR="$work/pgdata"
unset JOBTUI_DSN DATABASE_URL
# The console needs a terminal; CI has none, so the same demo runs headless.
eval "${cmd} --no-tui --seconds 10"
