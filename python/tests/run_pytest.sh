#!/usr/bin/env bash
# Runs the Python tests with the venv of scripts/install-deps.sh ($LATENT_PYTHON, else
# $LATENT_VENV/bin/python, default ~/.cache/gst-latent/venv). Arguments go to pytest.
# pytest's "no tests collected" (exit 5) is a failure here: a filter that matches nothing is a bug.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${LATENT_PYTHON:-${LATENT_VENV:-$HOME/.cache/gst-latent/venv}/bin/python}"
if [ ! -x "$py" ]; then
  echo "run_pytest.sh: no Python environment at $py; run scripts/install-deps.sh" >&2
  exit 1
fi
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" RAY_USAGE_STATS_ENABLED=0
"$py" -m pytest -q -p no:cacheprovider "$here" "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run_pytest.sh: pytest collected no tests ($*)" >&2
  exit 1
fi
exit "$rc"
