#!/usr/bin/env bash
# Cross-builds test suites for aarch64-unknown-linux-gnu and runs them under qemu-user
# (issue 32: ferrite on Arm). Installs nothing: it checks for the cross gcc, qemu-aarch64,
# the aarch64 C library and the Rust target, names each one missing with the command that
# installs it, and exits 2 before building anything if any is missing.
#
# usage: scripts/aarch64-test.sh [SUITE...]    SUITE: quant (default), cpu, model
# Prints the target triple, `uname -m` under qemu and the SIMD level ferrite-quant detects
# there, then each suite's cargo test output and wall time. Extra cargo test arguments go
# in CARGO_TEST_ARGS (e.g. "-- --test-threads 2"); CARGO_BUILD_JOBS and CARGO_TARGET_DIR
# pass through to cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

triple=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(quant)
for s in "${suites[@]}"; do
  case $s in
    quant | cpu | model) ;;
    *)
      echo "aarch64-test: unknown suite '$s' (choose from quant, cpu, model)" >&2
      exit 64
      ;;
  esac
done

missing=0
need() { # need WHAT INSTALL-COMMAND: reports a missing tool
  echo "aarch64-test: missing $1; install it with: $2" >&2
  missing=1
}
command -v aarch64-linux-gnu-gcc > /dev/null ||
  need "the cross gcc (aarch64-linux-gnu-gcc)" "apt-get update && apt-get install -y gcc-aarch64-linux-gnu"
command -v qemu-aarch64 > /dev/null ||
  need "qemu-aarch64" "apt-get update && apt-get install -y qemu-user"
[ -e "$sysroot/lib/ld-linux-aarch64.so.1" ] ||
  need "the aarch64 C library ($sysroot)" "apt-get update && apt-get install -y libc6-arm64-cross"
if ! command -v rustup > /dev/null; then
  need "rustup (to check the Rust target)" "see https://rustup.rs"
elif ! rustup target list --installed | grep -qx "$triple"; then
  need "the Rust target $triple" "rustup target add $triple"
fi
if [ $missing -ne 0 ]; then
  echo "aarch64-test: nothing was built" >&2
  exit 2
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $sysroot"

# `uname -m` as a program under qemu sees it: a two-line C program, cross-compiled.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <stdio.h>\n#include <sys/utsname.h>\nint main(void) { struct utsname u; if (uname(&u)) return 1; puts(u.machine); return 0; }\n' \
  > "$probe/uname.c"
aarch64-linux-gnu-gcc -O1 -o "$probe/uname" "$probe/uname.c"
echo "aarch64-test: target $triple, runner: $CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER"
echo "aarch64-test: uname -m under qemu: $(qemu-aarch64 -L "$sysroot" "$probe/uname")"

# The level test prints the level in use ("simd level in use: ..."); FERRITE_SIMD is
# cleared so it reports what the crate detects.
level=$(env -u FERRITE_SIMD cargo test -q -p ferrite-quant --target "$triple" --lib \
  level::tests::display_names_round_trip -- --nocapture 2>&1 |
  sed -n 's/^simd level in use: //p')
echo "aarch64-test: SIMD level ferrite-quant detects under qemu: ${level:-UNKNOWN}"
[ -n "$level" ] || {
  echo "aarch64-test: could not read the SIMD level" >&2
  exit 1
}

for s in "${suites[@]}"; do
  echo "aarch64-test: suite $s (cargo test -p ferrite-$s --target $triple ${CARGO_TEST_ARGS:-})"
  start=$(date +%s)
  # shellcheck disable=SC2086 # CARGO_TEST_ARGS is a list of words
  cargo test -p "ferrite-$s" --target "$triple" ${CARGO_TEST_ARGS:-}
  echo "aarch64-test: suite $s passed in $(($(date +%s) - start)) s"
done
echo "aarch64-test: all suites passed (${suites[*]}) on $triple under qemu, SIMD level $level"
