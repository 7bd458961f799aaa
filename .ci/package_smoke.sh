#!/usr/bin/env bash
# Builds the sdist and wheel, checks them, installs the wheel in a fresh virtual environment
# and runs it: `jobtui --version`, then migrate, enqueue and a worker that runs the job, on
# JOBTUI_TEST_DSN in a schema of its own (dropped afterwards).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
: "${JOBTUI_TEST_DSN:?set JOBTUI_TEST_DSN}"
work="$(mktemp -d /tmp/jobtui-package-XXXXXX)"
schema="jobtui_pkg_$$"
worker_pid=""
cleanup() {
    [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null || true
    psql "$JOBTUI_TEST_DSN" -qc "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

"$root/.venv/bin/python" -m build --outdir "$work/dist" "$root" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$root/.venv/bin/twine" check --strict "$work"/dist/*
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$work"/dist/jobtui-*.whl
"$work/venv/bin/python" -c "import jobtui, pathlib; assert (pathlib.Path(jobtui.__file__).parent / 'py.typed').exists()"
"$work/venv/bin/jobtui" --version

cat >"$work/smoke_app.py" <<'PY'
import jobtui

jobs = jobtui.Jobs()


@jobs.handler("smoke.ok")
def ok(job: jobtui.Job) -> None:
    print(f"ran job {job.id}", flush=True)
PY
cd "$work"
export JOBTUI_DSN="$JOBTUI_TEST_DSN"
venv/bin/jobtui --schema "$schema" migrate
venv/bin/jobtui --schema "$schema" enqueue smoke.ok --payload '{"from": "the wheel"}'
venv/bin/jobtui --schema "$schema" worker --app smoke_app:jobs --no-scheduler --poll 100ms >"$work/worker.log" 2>&1 &
worker_pid=$!
for _ in $(seq 1 100); do
    done_jobs="$(venv/bin/jobtui --schema "$schema" jobs --status done --count --json | venv/bin/python -c \
        'import json, sys; print(sum(c["jobs"] for c in json.load(sys.stdin)))')"
    [ "$done_jobs" = "1" ] && break
    sleep 0.2
done
kill "$worker_pid" && wait "$worker_pid" || true
worker_pid=""
if [ "$done_jobs" != "1" ]; then
    echo "the installed wheel's worker did not run the job:" >&2
    cat "$work/worker.log" >&2
    exit 1
fi
echo "package smoke: built, checked, installed and ran a job from the wheel"
