#!/usr/bin/env bash
# Generates the Go code of proto/ into clients/go/gantry/v1 with buf and
# the pinned protoc-gen-go and protoc-gen-go-grpc (built from the Go module
# proxy once, cached outside the clone by version). `--check` generates
# into a scratch directory and fails if the committed code differs.
set -euo pipefail
cd "$(dirname "$0")/../.."
PROTOC_GEN_GO=v1.36.12
PROTOC_GEN_GO_GRPC=v1.6.0
BIN="${XDG_CACHE_HOME:-$HOME/.cache}/gantry/go-plugins/go-$PROTOC_GEN_GO-grpc-$PROTOC_GEN_GO_GRPC/bin"
if [ ! -x "$BIN/protoc-gen-go" ] || [ ! -x "$BIN/protoc-gen-go-grpc" ]; then
  mkdir -p "$BIN"
  GOBIN="$BIN" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO"
  GOBIN="$BIN" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC"
fi
BUF="${BUF:-.ci/tools/node_modules/.bin/buf}"
[ -x "$BUF" ] || BUF=buf
if [ "${1:-}" = "--check" ]; then
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
  PATH="$BIN:$PATH" "$BUF" generate --template clients/go/buf.gen.yaml -o "$out"
  if ! diff -r "$out/clients/go/gantry" clients/go/gantry; then
    echo "clients/go/gantry differs from what proto/ generates: run clients/go/generate.sh and commit" >&2
    exit 1
  fi
  echo "clients/go: generated code is up to date"
else
  PATH="$BIN:$PATH" "$BUF" generate --template clients/go/buf.gen.yaml
fi
