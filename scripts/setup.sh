#!/usr/bin/env bash
# Create .venv idempotently from its lock, scripts/locks/venv.txt: every distribution at the exact version and hash
# the lock pins (torch 2.14.1 / torchvision 0.29.1 come from local disk where pip finds them there), then the project
# itself, editable, without dependencies. Reinstalls when the lock or pyproject.toml is newer than the stamp or not
# what it recorded. A lock made for another Python or CPU architecture is refused in one line, exit 2
# (scripts/lock.sh refreshes a lock; scripts/locks/install.sh does the work).
set -euo pipefail
cd "$(dirname "$0")/.."  # it installs into the checkout: runs in the repository root (no path arguments)
source scripts/locks/install.sh
LOCK=scripts/locks/venv.txt
lock_platform_ok "$LOCK"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
lock_up_to_date .venv "$LOCK" && exit 0
lock_install .venv "$LOCK"
echo "setup: .venv ready ($LOCK)"
