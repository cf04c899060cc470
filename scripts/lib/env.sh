# Sourced by the scripts that build or run the host: what they share.
# shellcheck shell=bash

# The host is built static (musl) for the tests, so the container image packages the very binary
# the tests ran, and wasmtime is compiled once per CI run.
host_target=x86_64-unknown-linux-musl

# The guest crates (examples and fixtures): built for wasm32-wasip2 by scripts/guests, never as
# host code.
guest_packages=(bank-payments bank-payments-manual sluice-fixture sluice-fixture-v2
  sluice-fixture-hang sluice-fixture-ordered sluice-fixture-journaled sluice-other-world)

# Where cargo builds (CARGO_TARGET_DIR, else ./target) and where the tested host binaries are.
build_dir="${CARGO_TARGET_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/target}"
host_bin_dir="$build_dir/$host_target/debug"

# Tools kept outside the checkout by version (mdbook, componentize-py, componentize-js).
dev_cache="${SLUICE_DEV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice-dev}"

# The host side (every crate but the guests), every target (lib, bins, tests, examples, benches),
# static: what the tests run and the image packages. One command everywhere, so one feature set
# and one compile (a narrower `-p` would resolve other features and compile some crates again).
build_host_side() {
  cargo build --locked --target "$host_target" --workspace "${guest_packages[@]/#/--exclude=}" \
    --all-targets
}
