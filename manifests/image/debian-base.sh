#!/usr/bin/env bash
# Makes a local stand-in for the Dockerfile's default base (python:3.11-slim-bookworm) when no registry is
# reachable: a debootstrap of the same Debian release (bookworm) with Debian's Python 3.11 and venv/ensurepip,
# imported into the local container storage (buildah/podman) as BASE_REF. Prints the reference.
#
# The root filesystem tarball is cached in ${DRA_GPU_CACHE:-~/.cache/dra-gpu}/images/base/, so a second
# machine with the same cache (or a wiped container storage) only re-imports it.
# The tarball's sha256 is recorded beside it when debootstrap writes it (.sha256) and checked before every
# import, so what goes into the container storage is what was built; build.sh then names the imported image by
# its digest (FROM ...@sha256:), and the image's provenance records that digest.
# Usage: manifests/image/debian-base.sh [--rebuild]
# Needs root (debootstrap chroots), debootstrap and buildah (e2e/cluster/install-host-deps.sh image).
set -euo pipefail
RELEASE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# python3-venv: the Dockerfile's build stage runs `python -m venv` (ensurepip); python-is-python3: `python`;
# mount: the plugin binds an MPS daemon's pipe directory at /tmp/nvidia-mps in a private mount namespace
# (`unshare -m` from util-linux, which minbase has, then `mount --bind`; dra_gpu/sharing/mps_namespace.py).
INCLUDE=python3,python3-venv,python-is-python3,mount
BASE_REF="${BASE_REF:-localhost/dra-gpu-base:$RELEASE-python3}"
CACHE="${DRA_GPU_CACHE:-$HOME/.cache/dra-gpu}/images/base"
TARBALL="$CACHE/debian-$RELEASE-python3.tar"
# The recipe goes into the image label, so a changed recipe is noticed and rebuilt.
RECIPE="debootstrap --variant=minbase --include=$INCLUDE $RELEASE"

log() { echo "[base] $*" >&2; }
die() { echo "[base] ERROR: $*" >&2; exit 1; }

[[ "${1:-}" == "--rebuild" ]] && rm -f "$TARBALL" "$TARBALL.recipe" "$TARBALL.sha256"
command -v buildah >/dev/null || die "buildah is not installed: run e2e/cluster/install-host-deps.sh image"

if [[ "$(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "dra-gpu.base-recipe"}}' \
        "$BASE_REF" 2>/dev/null || true)" == "$RECIPE" && -f "$TARBALL" ]]; then
    echo "$BASE_REF"; exit 0
fi

if [[ ! -f "$TARBALL" || "$(cat "$TARBALL.recipe" 2>/dev/null)" != "$RECIPE" ]]; then
    [[ $EUID -eq 0 ]] || die "debootstrap needs root; run as root (or pass PYTHON_IMAGE=<a pullable image>)"
    command -v debootstrap >/dev/null || die "debootstrap is not installed: run e2e/cluster/install-host-deps.sh image"
    work="$(mktemp -d /tmp/dra-gpu-base.XXXXXX)"
    trap 'rm -rf "$work"' EXIT
    log "debootstrap $RELEASE from $MIRROR (minbase + $INCLUDE) ..."
    t0=$SECONDS
    debootstrap --variant=minbase --include="$INCLUDE" "$RELEASE" "$work/root" "$MIRROR" \
        >"$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }
    # What the official slim images also leave out: package lists and caches, docs, man pages, locales.
    rm -rf "$work/root"/var/cache/apt/* "$work/root"/var/lib/apt/lists/* "$work/root"/var/log/* \
        "$work/root"/usr/share/doc/* "$work/root"/usr/share/man/* "$work/root"/usr/share/info/* \
        "$work/root"/usr/share/locale/* "$work/root"/var/cache/debconf/*-old "$work/root"/tmp/*
    # The build host's name and resolver must not end up in the image; the runtime provides both.
    rm -f "$work/root/etc/hostname" "$work/root/etc/resolv.conf"
    mkdir -p "$CACHE"
    tar --numeric-owner --xattrs -C "$work/root" -cf "$TARBALL.tmp" .
    mv "$TARBALL.tmp" "$TARBALL"
    printf '%s' "$RECIPE" >"$TARBALL.recipe"
    sha256sum "$TARBALL" | awk '{ print $1 }' >"$TARBALL.sha256"
    rm -rf "$work"; trap - EXIT
    log "root filesystem $(du -h "$TARBALL" | cut -f1) in $((SECONDS - t0))s -> $TARBALL"
fi

sum="$(sha256sum "$TARBALL" | awk '{ print $1 }')"
if [[ ! -f "$TARBALL.sha256" ]]; then
    # A tarball from before the sums were recorded: this import is the one later imports are checked against.
    echo "$sum" >"$TARBALL.sha256"
    log "recorded sha256 $sum of $TARBALL (first import since it was written)"
elif [[ "$(cat "$TARBALL.sha256")" != "$sum" ]]; then
    die "$TARBALL has sha256 $sum, not the $(cat "$TARBALL.sha256") recorded when it was built: run $0 --rebuild"
fi
log "importing $TARBALL (sha256 $sum) as $BASE_REF"
ctr="$(buildah from --quiet scratch)"
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
buildah add --quiet "$ctr" "$TARBALL" / >/dev/null
buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 --os linux --arch amd64 --label "dra-gpu.base-recipe=$RECIPE" \
    --label "org.opencontainers.image.description=Debian $RELEASE minbase with python3 (local base for dra-gpu)" \
    "$ctr"
buildah commit --quiet --rm "$ctr" "$BASE_REF" >/dev/null
trap - EXIT
echo "$BASE_REF"
