#!/usr/bin/env bash
# Runs every fuzz target for a bounded time and fails on the first crash, printing the input
# that reproduces it. storage_ops runs once per backend (and against the S3 server when its
# environment is set, see scripts/servers.sh).
#
#   scripts/fuzz-smoke.sh [SECONDS_PER_RUN]     (default 20)
#
# cargo-fuzz builds with sanitizer flags that rustc accepts only on nightly. This machine has
# stable Rust, so RUSTC_BOOTSTRAP=1 lets stable rustc take them; with a nightly toolchain,
# `cargo +nightly fuzz run <target>` needs nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}

if ! command -v cargo-fuzz >/dev/null; then
    echo "installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked --version 0.13.2
fi
export RUSTC_BOOTSTRAP=1

# A claim-driven allocation (a header asking for gigabytes) must trip these limits.
limits=(-rss_limit_mb=1024 -malloc_limit_mb=256 -timeout=20 -print_final_stats=1)

run() {
    local target=$1 label=$2
    shift 2
    local scratch
    scratch=$(mktemp -d)
    echo "==> fuzz $label for ${seconds}s" >&2
    # New inputs go to a scratch corpus; the committed seeds are read only.
    if ! cargo fuzz run -O "$target" "$scratch" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" "${limits[@]}" "$@" 2>&1 | tee "$scratch.log" |
        grep -E "^(#[0-9]+[[:space:]]+DONE|stat::|==[0-9]+==|SUMMARY|artifact_prefix|Test unit written)" >&2; then
        :
    fi
    if grep -qE "Test unit written|SUMMARY:|panicked" "$scratch.log"; then
        echo "error: fuzz $label crashed; reproducer:" >&2
        grep -E "Test unit written to" "$scratch.log" >&2 || true
        echo "replay: RUSTC_BOOTSTRAP=1 cargo fuzz run $target <that file>" >&2
        exit 1
    fi
    rm -rf "$scratch" "$scratch.log"
}

run reader reader -dict=fuzz/dict/reader.dict
run roundtrip roundtrip
run codec codec
backends=(memory local mmap object-memory object-local)
if [ -n "${WEIGHTBAY_S3_URL:-}" ]; then backends+=(s3); fi
for backend in "${backends[@]}"; do
    WEIGHTBAY_FUZZ_BACKEND=$backend run storage_ops "storage_ops on $backend"
done
