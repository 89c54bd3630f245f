#!/usr/bin/env bash
# One ferrite binary serving, loaded by `ferrite bench serve` with a chosen prompt and
# output length: for comparing two ferrite builds at one load. The server is reaped before
# the script exits, so shared/tools/clean-run counts its CPU time as the command's own.
#
#   serve-one-engine.sh FERRITE_BIN MODEL OUT_CSV PROMPT_TOKENS MAX_TOKENS [CONCURRENCY]
#
# SERVE_FLAGS adds flags to the server's command line (e.g. SERVE_FLAGS="--kv q8").
set -euo pipefail
ferrite=${1:?ferrite binary}
model=${2:?model file}
out=${3:?output csv}
prompt=${4:?prompt tokens}
gen=${5:?max tokens}
conc=${6:-1,16}
"$ferrite" serve -m "$model" --port 8093 --parallel 16 --threads 2 --ctx 512 \
    --kv-mem-space-mb 0 ${SERVE_FLAGS:-} >"${out%.csv}-server.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8093/health) == 200 ]] && break
    sleep 0.5
done
"$ferrite" bench serve --url http://127.0.0.1:8093 --concurrency "$conc" \
    --prompt-tokens "$prompt" --max-tokens "$gen" --rounds 2 --csv "$out"
kill "$pid"
wait "$pid" 2>/dev/null || true
