#!/usr/bin/env bash
# README.md's Python install, as written: the commands of the first sh block after
# "### From Python and PyTorch", run from the repository root; then the installed package (not
# the source folder) compresses and decompresses an array.
set -euo pipefail
repo=$1
unset PYTHONPATH  # the package under test is the one installed, not the build tree's
cd "$repo"
commands=$(awk '/^### From Python and PyTorch/ { section = 1 }
                section && /^```sh$/ { block = 1; next }
                block && /^```$/ { exit }
                block { print }' README.md)
[ -n "$commands" ] || { echo "no install commands found in README.md" >&2; exit 1; }
printf 'README.md says:\n%s\n' "$commands"
bash -euxc "$commands"
cd /
"$repo/.venv/bin/python" - <<'PY'
import numpy as np
import kompress
assert "/.venv/" in kompress.__file__, kompress.__file__
x = np.linspace(-1, 1, 10000, dtype=np.float32)
y = kompress.decompress(kompress.compress(x, rel=1e-3))
assert np.max(np.abs(x - y)) <= 2e-3
print("installed kompress round trip ok:", kompress.__file__)
PY
