#!/bin/sh
# make bench-forward: ra against llama.cpp on the same model and threads. Installs
# llama-cpp-python (built from source, several minutes the first time) into build/venv-bench,
# or uses the interpreter in $RA_BENCH_PYTHON when set.
set -eu
model=$1
py=${RA_BENCH_PYTHON:-}
if [ -z "$py" ]; then
    if [ ! -x build/venv-bench/bin/python ]; then
        echo "installing llama-cpp-python into build/venv-bench (built from source: several minutes) ..." >&2
        python3 -m venv build/venv-bench
        CMAKE_ARGS="-DGGML_NATIVE=ON" build/venv-bench/bin/pip install --quiet llama-cpp-python==0.3.36
    fi
    py=build/venv-bench/bin/python
fi
"$py" tests/bench_forward.py "$model" ${BENCH_ARGS:-}
