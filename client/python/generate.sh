#!/bin/bash
# Generates cohort's Python gRPC stubs (package cohort.v1: *_pb2.py messages, *_pb2_grpc.py
# stubs) from proto/cohort/v1/*.proto with Debian's protoc and grpc_python_plugin, the same
# compilers the C++ stubs come from (packages protobuf-compiler, protobuf-compiler-grpc).
#
# Usage: client/python/generate.sh OUTDIR [PROTO_ROOT]
#   OUTDIR      where cohort/v1/*.py go; put OUTDIR and client/python on PYTHONPATH, e.g.
#                 client/python/generate.sh ~/.cache/cohort-py
#                 PYTHONPATH=~/.cache/cohort-py:client/python /usr/bin/python3 -c 'import cohort_client'
#   PROTO_ROOT  the directory holding cohort/v1/*.proto (default: proto/ of this checkout)
#
# Why not python3-grpc-tools: Debian's (1.14) bundles protoc 3.6, which rejects the proto3
# `optional` fields of job.proto; protoc 3.21's Python output also matches python3-protobuf 3.21.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 || "$1" == "--help" || "$1" == "-h" ]]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  [[ $# -ge 1 && ( "$1" == "--help" || "$1" == "-h" ) ]] && exit 0
  exit 2
fi
out="$1"
proto_root="${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../proto" && pwd)}"
protoc="${PROTOC:-protoc}"
plugin="${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || true)}"

command -v "${protoc}" >/dev/null ||
  { echo "generate.sh: ${protoc} not found; install protobuf-compiler (deploy/install-deps.sh)" >&2; exit 1; }
[[ -n "${plugin}" && -x "${plugin}" ]] ||
  { echo "generate.sh: grpc_python_plugin not found; install protobuf-compiler-grpc (deploy/install-deps.sh)" >&2; exit 1; }
shopt -s nullglob
protos=("${proto_root}"/cohort/v1/*.proto)
[[ ${#protos[@]} -gt 0 ]] ||
  { echo "generate.sh: no .proto files under ${proto_root}/cohort/v1; pass PROTO_ROOT" >&2; exit 1; }

mkdir -p "${out}/cohort/v1"
# google/protobuf/timestamp.proto comes with libprotobuf-dev (or protobuf-compiler) in /usr/include.
"${protoc}" --proto_path="${proto_root}" --proto_path=/usr/include \
  --python_out="${out}" --grpc_out="${out}" --plugin=protoc-gen-grpc="${plugin}" "${protos[@]}"
# Regular packages (not namespace ones), so that any tool that walks packages finds them.
: > "${out}/cohort/__init__.py"
: > "${out}/cohort/v1/__init__.py"
