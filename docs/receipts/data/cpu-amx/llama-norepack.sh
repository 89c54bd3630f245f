#!/usr/bin/env bash
exec /work/peer/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server "$@" --no-repack
