#!/usr/bin/env bash
# The queue's core (enqueue, claim, outcomes, retries, leases, schedules) and the unit tests
# again on Python 3.13, in a venv of its own (.venv-3.13), when the machine has a 3.13:
# pyenv's newest, else python3.13 on PATH. Without one it says so and passes.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${JOBTUI_TEST_DSN:?set JOBTUI_TEST_DSN}"

# A usable 3.13: the version itself, with venv and pip (Debian ships them apart), and not the
# free-threaded build (3.13t), for which several dependencies have no wheels.
usable() {
    "$1" -c 'import ensurepip, sys, sysconfig, venv
sys.exit(sys.version_info[:2] != (3, 13) or bool(sysconfig.get_config_var("Py_GIL_DISABLED")))' 2>/dev/null
}

candidates=()
shopt -s nullglob
for pyenv_root in "${PYENV_ROOT:-$HOME/.pyenv}" /root/.pyenv; do
    mapfile -t -O "${#candidates[@]}" candidates < <(printf '%s\n' "$pyenv_root"/versions/3.13*/bin/python | sort -V -r)
done
shopt -u nullglob
if command -v python3.13 >/dev/null 2>&1; then
    candidates+=("$(command -v python3.13)")
fi
python=""
for candidate in "${candidates[@]}"; do
    if [ -x "$candidate" ] && usable "$candidate"; then
        python="$candidate"
        break
    fi
done
if [ -z "$python" ]; then
    echo "Python 3.13 run skipped: no usable Python 3.13 (looked in ${PYENV_ROOT:-$HOME/.pyenv}/versions/3.13*/ and for python3.13 on PATH)" >&2
    exit 0
fi

# Made again when missing, or when its interpreter is no longer there or no longer 3.13.
if ! { [ -x .venv-3.13/bin/python ] && usable .venv-3.13/bin/python; }; then
    "$python" -m venv --clear .venv-3.13
fi
echo "Python 3.13 run: $("$python" -VV | head -1) ($python)"
.venv-3.13/bin/pip install -q -e '.[dev]'
.venv-3.13/bin/pytest -q -n 2 -p no:cacheprovider \
    tests/integration/test_queue.py tests/integration/test_state_machine.py \
    tests/integration/test_scheduler.py tests/unit
