#!/usr/bin/env bash
# Builds gantry's container image on this machine, with no base image and no
# registry: the release binaries of gateway-store, gateway-reconciler and
# gatewayctl, the shared libraries they load, CA certificates and
# /etc/passwd for user 65532 (the image runs as it), written as an OCI
# archive that `ctr -n k8s.io images import`, `podman load`, `skopeo` and
# `docker load` read. Prints NAME@sha256:DIGEST as its last line.
#
#   deploy/image/build.sh [OUT.tar]     (default target/image/gantry.oci.tar)
#
# Reproducible: the same commit, built in the same directory with the same
# toolchain, gives the same digest (every time in the image is the commit's
# time, SOURCE_DATE_EPOCH; entries are sorted; JSON and gzip are canonical).
# GANTRY_IMAGE_BINARIES=DIR takes the three binaries from DIR instead of
# building them (the tests pass their own build); GANTRY_IMAGE_NAME renames
# the image (default ghcr.io/gantry-dev/gantry, tag: the version).
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${CARGO_TARGET_DIR:-target}/image/gantry.oci.tar}"
binaries="${GANTRY_IMAGE_BINARIES:-}"
if [ -z "$binaries" ]; then
  cargo build --release --locked -p gantry-store -p gantry-reconciler -p gantry-ctl >&2
  binaries="${CARGO_TARGET_DIR:-target}/release"
fi
version="$(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)"
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
cargo run --quiet --locked -p gantry-image -- gantry \
  --binaries "$binaries" --out "$out" --tag "$version" --epoch "$epoch" --revision "$revision"
