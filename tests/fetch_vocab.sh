#!/bin/sh
# Fetch llama.cpp's tokenizer test vocabularies (vocab-only GGUF files with their .inp/.out
# cases, whose expected ids come from the Hugging Face tokenizers) out of the llama-cpp-python
# source package on PyPI. Only these data files are kept, in tests/data/vocab (git-ignored).
#   sh tests/fetch_vocab.sh tests/data/vocab
set -eu
out=$1
pkg=llama-cpp-python==0.3.36
sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
names="llama-spm llama-bpe qwen2 gpt-2 starcoder refact command-r mpt phi-3 falcon"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching the tokenizer test vocabularies from $pkg on PyPI (77 MB) ..." >&2
if ! python3 -m pip download --quiet --no-deps --no-binary :all: --dest "$tmp" "$pkg" >"$tmp/log" 2>&1; then
    cat "$tmp/log" >&2
    echo "error: could not download $pkg from PyPI: is the registry reachable?" >&2
    exit 1
fi
sdist=$(ls "$tmp"/*.tar.gz)
sum=$(sha256sum "$sdist" | cut -d' ' -f1)
if [ "$sum" != "$sha" ]; then
    echo "error: sha256 of $sdist is $sum, expected $sha" >&2
    exit 1
fi
members=""
for n in $names; do
    for ext in gguf gguf.inp gguf.out; do
        members="$members llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-$n.$ext"
    done
done
# shellcheck disable=SC2086
tar -xzf "$sdist" -C "$tmp" $members
mkdir -p "$out"
mv "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp/models/* "$out"/
echo "vocab: $out ($(ls "$out" | wc -l) files)" >&2
