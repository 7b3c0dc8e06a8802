#!/usr/bin/env bash
# Installs, from Debian's packages, everything cohort's build, tests, benchmarks and examples need.
# Idempotent and non-interactive: skips what is present, runs `apt-get update` only when it must
# install something. Usage: deploy/install-deps.sh   (as root, or with sudo available)
set -euo pipefail

packages=(
  bazel-bootstrap g++ git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libucx-dev ucx-utils
  libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev
  libtorch-dev
  # Debian's libtorch recommends OpenBLAS, which --no-install-recommends below would skip, leaving
  # the netlib reference BLAS behind libblas.so.3: its sgemm was 38 % of a Fashion-MNIST training
  # step, and OpenBLAS halved the step's CPU time (74 -> 37 ms, bench/README.md). The threaded
  # build (Debian's default flavour), not the serial one: the serial build has no locking, and two
  # threads of one process calling it at once got wrong products (in-process rank threads, and
  # libtorch's own intra-op threads). Ranks set its thread count next to libtorch's
  # (worker/base/blas_threads.h); tests/train:blas_thread_safety_test checks which build is in use.
  libopenblas0-pthread
  libyaml-cpp-dev libsqlite3-dev libsystemd-dev libssl-dev
  # systemd-analyze: deploy:cohortd_service_security_test scores the unit (--offline, no running systemd).
  systemd
  dataset-fashion-mnist
  # Fuzz targets (tests/fuzz/build_and_run.sh): clang with libFuzzer and AddressSanitizer.
  clang libclang-rt-14-dev
  # tests/launchers/slurm: a one-host Slurm the test starts itself (slurmctld, slurmd, munged, and
  # slurmdbd over a MariaDB server in its temporary directory, so that sacct has job accounting).
  # The -core MariaDB packages hold mariadbd and its client without a system service. mpirun
  # (tests/launchers/mpirun) is openmpi-bin below.
  slurm-wlm slurmdbd munge mariadb-server-core mariadb-client-core
  # The Python client for schedulers (client/python): its stubs come from protoc and
  # grpc_python_plugin above; it runs on Debian's python3.
  python3-grpcio python3-protobuf python3-yaml
  # cohortd's HTTPS port (daemon/http: cpp-httplib over OpenSSL) and its /metrics page
  # (prometheus-cpp's registry and text format); tests/observability checks the page with promtool
  # and scrapes it with a real Prometheus server (the prometheus package holds both).
  libcpp-httplib-dev prometheus-cpp-dev prometheus
  # The coordinator's dashboard (daemon/http/dashboard) serves Debian's Chart.js itself;
  # tests/observability:dashboard_test drives headless Chromium over the DevTools protocol from
  # python3 (python3-websocket).
  libjs-chart.js chromium python3-websocket
  # Benchmarks only: the peers cohort is measured against, never linked into cohort.
  libopenmpi-dev openmpi-bin python3-torch
  # bench/compare_ddp.sh: peak RSS per rank with GNU time -v.
  time
  # deploy/install.sh, deploy/package-deb.sh and tests/install: the CMake and pkg-config consumers,
  # dpkg-shlibdeps, RUNPATH removal and the package check.
  cmake pkg-config dpkg-dev patchelf lintian adduser
  # tests/cluster: simulated hosts in network and UTS namespaces (ip, unshare, nsenter); jq reads
  # the CLI's JSON; the HA chaos test makes etcd's certificates with openssl and asks coordinators'
  # gRPC health with curl (HTTP/2).
  iproute2 util-linux jq openssl curl
  # One flag library for every binary (header-only CLI11 under /usr/include/CLI, third_party:cli11);
  # tests/cli drives `cohort submit --follow` on a real terminal in tmux.
  libcli11-dev tmux
  # tests/control_plane:reflection_health_test: its clients read grpc.reflection.v1alpha's and
  # grpc.health.v1's .proto files at run time (grpc-proto) with protobuf's compiler::Importer
  # (libprotoc-dev's headers; the code is in libprotobuf).
  grpc-proto libprotoc-dev
  # daemon/etcd: the highly available coordinator's job store and leader election on etcd 3.4
  # (etcd-server; tests/etcd starts real clusters); its v3 .proto files (golang-etcd-server-dev,
  # which pulls gogoproto and google/api's annotations) are compiled into C++ stubs by //third_party:etcd_api.
  etcd-server golang-etcd-server-dev
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  sudo="sudo"
fi

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  [[ -z "$sudo" ]] || command -v sudo >/dev/null ||
    { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The unprivileged user a root cohortd runs jobs as when their owner has no user_map entry
# (job_user in the daemon config); the tests, run as root, need it too. Created only if missing.
if ! getent passwd cohort-job >/dev/null; then
  [[ -z "$sudo" ]] || command -v sudo >/dev/null ||
    { echo "install-deps: need root or sudo to create the cohort-job user" >&2; exit 1; }
  echo "install-deps: creating system user cohort-job"
  $sudo useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin cohort-job
fi
# An earlier install-deps installed the serial OpenBLAS. The threaded one's higher priority takes
# the alternatives over in auto mode; one set by hand to the serial build is only pointed out.
# libopenblas.so.0 decides which OpenBLAS loads (libblas.so.3 and liblapack.so.3 are thin
# wrappers that load it), so all three are looked at.
for group in libopenblas.so.0 libblas.so.3 liblapack.so.3; do
  if update-alternatives --query "${group}-x86_64-linux-gnu" 2>/dev/null |
      grep -q '^Value: .*openblas-serial/'; then
    echo "install-deps: warning: ${group} is set by hand to the serial OpenBLAS, which is not safe to" \
      "call from several threads of one process; switch with" \
      "'update-alternatives --auto ${group}-x86_64-linux-gnu'" >&2
  fi
done
echo "install-deps: done"
