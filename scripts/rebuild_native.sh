#!/usr/bin/env bash
# Rebuild the Cython extensions in native/ after editing them, for development.
# Builds into a temporary folder and renames the new .so files into place, so a
# process still running the old ones (a test, a server) keeps them intact; a lock
# keeps two rebuilds from writing native/*.c at once. `scripts/install.sh` does
# the same build for a fresh checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
export GGSERVE_GGML_PREFIX=${GGSERVE_GGML_PREFIX:-$PWD/.venv/ggml}
exec 9>/tmp/ggserve-native-build.lock
flock 9
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
.venv/bin/python setup.py -q build_ext --build-lib "$tmp" --build-temp "$tmp/build" >/dev/null
for so in "$tmp"/ggserve/native/*.so; do
    cp "$so" "native/.$(basename "$so").new"
    mv -f "native/.$(basename "$so").new" "native/$(basename "$so")"
done
echo "rebuilt: $(cd native && ls *.so | tr '\n' ' ')"
