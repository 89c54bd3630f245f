#!/usr/bin/env bash
# Soak `ferrite serve` (issue 35): 64 streaming clients for 10 minutes on loopback against
# the default model (SmolLM2), about 20 % of them hanging up mid-stream, RSS and /metrics
# sampled every 5 s; passes when RSS is flat after warm-up (the rule is in scripts/soak.py)
# and writes the receipt docs/receipts/soak-<date>.md.
#
#   scripts/soak.sh [soak.py options] [-- ferrite serve options]
#
# Builds the release binary first (target/release/ferrite). Needs python3 (stdlib only)
# and Linux /proc. The model is pulled into $FERRITE_HOME on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ferrite --bin ferrite
ferrite=target/release/ferrite
"$ferrite" pull smollm2-135m-instruct >/dev/null
exec python3 scripts/soak.py --binary "$ferrite" \
  --receipt "docs/receipts/soak-$(date -u +%Y-%m-%d).md" "$@"
