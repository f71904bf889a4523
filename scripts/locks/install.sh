# Sourced by scripts/setup.sh and scripts/setup_vllm_cpu.sh (run from the repository root): install a virtual
# environment from its lock file, every distribution at the pinned version and hash, then the project itself.
#   lock_platform_ok LOCK      exit 2 with one line when LOCK was made for another Python or CPU architecture
#   lock_up_to_date VENV LOCK  true when VENV's stamp is newer than LOCK and pyproject.toml and records both hashes
#   lock_install VENV LOCK     install LOCK (--require-hashes), the project (editable, no dependencies), drop what
#                              LOCK does not pin, and write the stamp
PY=${PYTHON:-python3}

lock_platform_ok() {
  local want have
  want=$(grep -m1 '^# platform: ' "$1" || true)
  have="# platform: python $("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])'), $(uname -m), linux"
  if [ "$want" != "$have" ]; then
    echo "setup: $1 was made for ${want#\# platform: }, this machine is ${have#\# platform: };" \
      "refresh it with: bash scripts/lock.sh" >&2
    exit 2
  fi
}

lock_up_to_date() {
  local stamp=$1/.grounding_rl_installed
  [ -f "$stamp" ] && [ "$stamp" -nt "$2" ] && [ "$stamp" -nt pyproject.toml ] \
    && [ "$(cat "$stamp")" = "$(sha256sum "$2" pyproject.toml)" ]
}

lock_install() {
  local venv=$1 lock=$2 extra
  "$venv/bin/python" -m pip install -q --require-hashes --no-deps -r "$lock"
  "$venv/bin/python" -m pip install -q --no-deps -e .
  # what an earlier lock pinned and this one does not (tests/test_lock.py names any that stay)
  extra=$("$venv/bin/python" - "$lock" <<'PY'
import re, sys
from importlib.metadata import distributions
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
keep = {norm(n) for n in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", open(sys.argv[1]).read(), re.M)}
print(" ".join(sorted({d.metadata["Name"] for d in distributions()
                       if norm(d.metadata["Name"]) not in keep | {"grounding-rl"}})))
PY
)
  [ -z "$extra" ] || "$venv/bin/python" -m pip uninstall -q -y $extra
  sha256sum "$lock" pyproject.toml > "$venv/.grounding_rl_installed"
}
