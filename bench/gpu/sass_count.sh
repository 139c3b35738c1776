#!/usr/bin/env bash
# SASS instruction counts of the CUDA kernels without a GPU (sass_count.py --help).
exec python3 "$(dirname "$0")/sass_count.py" "$@"
