#!/usr/bin/env bash
# Builds cohort_<version>_<arch>.deb (issue 12) with dpkg-deb: the binaries in /usr/bin, the worker
# library (libcohort_comm, libcohort_torch with headers, CMake package and pkg-config files) in
# /usr, the systemd unit as /lib/systemd/system/cohortd.service, the default config as the
# conffile /etc/cohort/cohortd.yaml, and a postinst that creates the system users. Depends is
# computed by dpkg-shlibdeps.
#
# Usage:
#   deploy/package-deb.sh [--out DIR] [--no-build]
#   deploy/package-deb.sh --help
# Check:   lintian --fail-on error cohort_0.1.0_amd64.deb
# Install: sudo apt install ./cohort_0.1.0_amd64.deb   (then edit /etc/cohort/cohortd.yaml and
#          systemctl enable --now cohortd)
set -euo pipefail

usage() {
  cat <<'EOF'
usage: deploy/package-deb.sh [--out DIR] [--no-build]

Builds cohort with Bazel (through deploy/install.sh --prefix /usr) and packages it as
DIR/cohort_<version>_<arch>.deb.

  --out DIR    where the .deb goes (default: the current directory)
  --no-build   package what the last build left in bazel-bin
  --help       this text
EOF
}

out=$(pwd) install_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) [[ $# -ge 2 ]] || { echo "package-deb.sh: --out needs a directory" >&2; exit 2; }; out=$2; shift 2 ;;
    --no-build) install_args+=(--no-build); shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "package-deb.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."

for tool in dpkg-deb dpkg-shlibdeps patchelf; do
  command -v "$tool" >/dev/null || { echo "package-deb.sh: $tool not found: run deploy/install-deps.sh" >&2; exit 1; }
done

version=$(sed -nE 's/.*kVersion = "([^"]+)".*/\1/p' worker/base/version.h)
# Who answers for the package (lintian refuses a local-only mail host).
maintainer=${COHORT_DEB_MAINTAINER:-cohort maintainers <maintainers@cohort.example.org>}
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
soversion=$(sed -nE 's/^COHORT_SOVERSION = "([^"]+)".*/\1/p' deploy/lib/BUILD)

# dpkg-shlibdeps wants a source tree: debian/control and the package's files under debian/cohort.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pkg="$work/debian/cohort"
deploy/install.sh --prefix /usr --libdir "lib/$multiarch" --destdir "$pkg" "${install_args[@]}"

# Installed where Debian's loader looks: no RUNPATH (Bazel's links carry the build's own), and
# stripped like any Debian binary.
for f in "$pkg"/usr/bin/* "$pkg/usr/lib/$multiarch"/libcohort_*.so.*; do
  [[ -L "$f" ]] && continue
  patchelf --remove-rpath "$f"
  strip --strip-unneeded --remove-section=.comment --remove-section=.note "$f"
done

install -D -m 0644 configs/cohortd.yaml "$pkg/etc/cohort/cohortd.yaml"
install -d "$pkg/lib/systemd/system"
# The unit names the tarball install's /usr/local/bin; the package installs to /usr/bin.
sed 's#/usr/local/bin/cohortd#/usr/bin/cohortd#g' deploy/cohortd.service >"$pkg/lib/systemd/system/cohortd.service"
chmod 0644 "$pkg/lib/systemd/system/cohortd.service"

doc="$pkg/usr/share/doc/cohort"
install -d "$doc"
cat >"$doc/copyright" <<'EOF'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: cohort
Comment: cohort's own source; it links Debian's system libraries and vendors none.

Files: *
Copyright: 2026 the cohort authors
License: Apache-2.0
 On Debian systems, the full text of the Apache License, Version 2.0 can be
 found in /usr/share/common-licenses/Apache-2.0.
EOF
date=$(date -R -d "@${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")
cat >"$work/changelog" <<EOF
cohort ($version) unstable; urgency=medium

  * Built from the cohort source tree by deploy/package-deb.sh.

 -- $maintainer  $date
EOF
gzip -9n -c "$work/changelog" >"$doc/changelog.gz"
chmod 0644 "$doc/copyright" "$doc/changelog.gz"

control="$pkg/DEBIAN"
install -d "$control"
echo "/etc/cohort/cohortd.yaml" >"$control/conffiles"
# The package's public libraries: a program linked against them depends on this package.
cat >"$control/shlibs" <<EOF
libcohort_comm $soversion cohort (>= $version)
libcohort_torch $soversion cohort (>= $version)
EOF
echo "activate-noawait ldconfig" >"$control/triggers"
cat >"$control/postinst" <<'EOF'
#!/bin/sh
# cohort: the system users. `cohort` is cohort's own account (files an operator hands to the
# cluster); `cohort-job` is the unprivileged user a root cohortd runs jobs as (job_user in
# /etc/cohort/cohortd.yaml). cohortd itself runs as root from cohortd.service: it must switch
# to each job's user. The unit is not enabled here: edit /etc/cohort/cohortd.yaml first, then
# `systemctl enable --now cohortd`.
set -e
if [ "$1" = "configure" ]; then
  if ! getent passwd cohort >/dev/null; then
    adduser --system --group --quiet --home /var/lib/cohort --no-create-home \
      --gecos "cohort training cluster" cohort
  fi
  if ! getent passwd cohort-job >/dev/null; then
    adduser --system --quiet --home /nonexistent --no-create-home \
      --gecos "cohort job runner" cohort-job
  fi
fi
exit 0
EOF
chmod 0755 "$control/postinst"

# Depends: every shared library the ELF files need, as Debian's packages (libtorch, UCX, gRPC...).
cat >"$work/debian/control" <<EOF
Source: cohort
Section: science
Priority: optional
Maintainer: $maintainer

Package: cohort
Architecture: $arch
Description: distributed deep-learning training
EOF
elves=()
while IFS= read -r -d '' f; do elves+=("$f"); done < <(find "$pkg/usr/bin" "$pkg/usr/lib/$multiarch" -maxdepth 1 -type f -print0)
(cd "$work" && dpkg-shlibdeps -Tdebian/cohort.substvars -l"debian/cohort/usr/lib/$multiarch" "${elves[@]#$work/}" 2>"$work/shlibdeps.err") ||
  { cat "$work/shlibdeps.err" >&2; echo "package-deb.sh: dpkg-shlibdeps failed" >&2; exit 1; }
# libcohort_torch needs libcohort_comm, which this package itself holds: no relation with self.
depends=$(sed -nE 's/^shlibs:Depends=//p' "$work/debian/cohort.substvars" | sed -E 's/(^|, )cohort \([^)]*\)//; s/^, //')
[[ -n "$depends" ]] || { echo "package-deb.sh: dpkg-shlibdeps computed no dependencies" >&2; exit 1; }

installed_size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
cat >"$control/control" <<EOF
Package: cohort
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_size
Depends: adduser, $depends
Suggests: libtorch-dev, libucx-dev, libspdlog-dev, libfmt-dev, libprotobuf-dev, libgrpc++-dev, cmake, pkg-config
Section: science
Priority: optional
Description: distributed deep-learning training daemon, CLI and C++ library
 cohortd runs on every node of a training cluster: a coordinator places
 data-parallel and model-parallel jobs and runs their rendezvous, agents start
 and supervise the ranks. The cohort CLI submits and watches jobs.
 .
 The package also holds the worker library for libtorch programs
 (libcohort_comm, libcohort_torch), its headers, a CMake package
 (find_package(cohort)) and pkg-config files.
EOF

(cd "$pkg" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) >"$control/md5sums"
chmod 0644 "$control/control" "$control/conffiles" "$control/shlibs" "$control/triggers" "$control/md5sums"

deb="$out/cohort_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build -Zxz "$pkg" "$deb" >/dev/null
echo "package-deb.sh: built $deb"
