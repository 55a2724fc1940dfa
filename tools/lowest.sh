#!/usr/bin/env bash
# The dependency range's low end, checked: a venv of its own holding pyproject.toml's lower bound of every
# dependency (its latest patch release: "transformers>=4.53" installs transformers~=4.53.0), the package without
# its dependencies, and a slice of the tests that touches what differs between versions (EAGLE's draft cache,
# Medusa, the zoo's shipped heads and their fingerprints, decoding, serving, identity). .ci/run runs it after the
# full suite; on a 2-core CPU it takes about 3 minutes (under 2 of them the tests, on 2 workers). LOWEST_VENV picks
# the venv's folder.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${LOWEST_VENV:-${TMPDIR:-/tmp}/specdec-lab-lowest}
reqs=$(python - <<'PY'
import re
text = open("pyproject.toml").read()
block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
for name, low in re.findall(r'^\s*"([A-Za-z0-9_.-]+)>=([0-9.]+)', block, re.M):
    print(f"{name}~={'.'.join((low.split('.') + ['0', '0'])[:3])}")
PY
)
[ -x "$venv/bin/python" ] || python -m venv "$venv"
echo "+ pip install (lowest)" $reqs
"$venv/bin/pip" install -q $reqs "pytest>=8,<10" "pytest-xdist>=3.8,<4"
"$venv/bin/pip" install -q --no-deps -e .
"$venv/bin/python" -c "import torch, transformers, tokenizers, numpy
print('lowest: torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers',
      tokenizers.__version__, 'numpy', numpy.__version__)"
"$venv/bin/python" -m pytest -p no:cacheprovider -o addopts="" -q -p no:benchmark -n 2 --dist loadfile \
  tests/test_eagle.py tests/test_medusa.py tests/test_train_heads.py tests/test_training.py tests/test_lm.py \
  tests/test_decoding.py tests/test_serving.py tests/test_identity.py tests/test_exactness.py
