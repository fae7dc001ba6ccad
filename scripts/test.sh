#!/usr/bin/env bash
# The one test command: lints, starts the local S3, GCS and Azure servers and the fault proxy the
# object-store tests need, runs every test in the workspace, builds the Python package into a
# cached venv (with torch from PyPI) and runs its tests, and smoke-runs the fuzz targets.
#
# Environment:
#   WEIGHTBAY_REQUIRE_SERVERS=1  a server that cannot start, a test that cannot reach one, or
#                                Python test dependencies (torch) that cannot be installed fail
#                                the run (CI sets it); otherwise such tests say why they skipped.
#   WEIGHTBAY_FUZZ_SECONDS=N     seconds per fuzz target in the smoke run (default 20; 0 skips).
#   WEIGHTBAY_CASES=N            property cases per conformance case (default 32).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc (libraries; broken intra-doc links and every rustdoc warning are errors)"
# --lib: the CLI's binary is named `weightbay` like core's library, and their docs would
# overwrite each other (cargo issue 6313).
RUSTDOCFLAGS=-Dwarnings cargo doc --no-deps --workspace --lib --locked

step "starting the local S3, GCS and Azure servers and the fault proxy"
trap 'scripts/servers.sh stop-all >&2 || true' EXIT
for server in s3 gcs azure proxy; do
    if exports=$(scripts/servers.sh start "$server"); then
        eval "$exports"
    elif [ "${WEIGHTBAY_REQUIRE_SERVERS:-0}" = 1 ]; then
        echo "error: the $server server did not start and WEIGHTBAY_REQUIRE_SERVERS=1" >&2
        exit 1
    else
        echo "warning: the $server server did not start; its tests will skip" >&2
    fi
done

step "Python test dependencies (torch, transformers, safetensors, maturin, pytest, mypy, ruff) in the cached venv"
venv=${WEIGHTBAY_CACHE:-$HOME/.cache/weightbay}/venv
python_ready=0
if [ -x "$venv/bin/python" ] && "$venv/bin/pip" install -q -r python/requirements-test.txt >&2; then
    python_ready=1
    # The Rust interop tests read our files with Python's safetensors.
    export WEIGHTBAY_PYTHON=$venv/bin/python
elif [ "${WEIGHTBAY_REQUIRE_SERVERS:-0}" = 1 ]; then
    echo "error: could not install python/requirements-test.txt into $venv" >&2
    exit 1
else
    echo "warning: the Python test dependencies did not install; the Python tests will skip" >&2
fi

step "cargo test --workspace"
cargo test --workspace --locked

if [ "$python_ready" = 1 ]; then
    step "Python package: built into the venv (maturin), linted (ruff, mypy --strict), tested (pytest)"
    VIRTUAL_ENV=$venv PATH=$venv/bin:$PATH maturin develop --quiet --locked -m python/Cargo.toml >&2
    (cd python && "$venv/bin/ruff" check . && "$venv/bin/ruff" format --check . && "$venv/bin/mypy")
    # The tests run the `weightbay` command cargo test built, on what Python wrote.
    WEIGHTBAY_CLI=${CARGO_TARGET_DIR:-target}/debug/weightbay \
        "$venv/bin/python" -m pytest -q python/tests
fi

step "fuzz seeds replayed on stable (cargo test in fuzz/)"
cargo test --manifest-path fuzz/Cargo.toml --locked

if [ "${WEIGHTBAY_FUZZ_SECONDS:-20}" != 0 ]; then
    step "fuzz smoke run"
    scripts/fuzz-smoke.sh "${WEIGHTBAY_FUZZ_SECONDS:-20}"
fi
