#!/usr/bin/env bash
# The README's two commands on a fresh Debian 12 machine, as a new user meets them: a minimal
# bookworm root (mmdebstrap, no recommends), a clone of this checkout's HEAD under /root (mode
# 0700, where root's clones go by default), then `bash scripts/quickstart.sh` and, with
# --tests, `bash scripts/test.sh`. Run as root on a Debian or Ubuntu machine; what the root
# installs comes from the package registries, as on a real fresh machine.
#
#   bash scripts/fresh-debian-check.sh            # the quick start (minutes)
#   bash scripts/fresh-debian-check.sh --tests    # and the whole test suite (long)
#
# The root is kept in $FRESH_ROOT (default /var/tmp/clusterjob-fresh/root) for a look after a
# failure; --rebuild makes it anew. The host's CA bundle and pip configuration are copied in,
# so a machine that reaches the registries through a proxy of its own works as it does here.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
tests=0 rebuild=0
for arg in "$@"; do
    case $arg in
    --tests) tests=1 ;;
    --rebuild) rebuild=1 ;;
    *) echo "usage: $0 [--tests] [--rebuild]" >&2 && exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "$0: run as root (it builds and enters a root file system)" >&2; exit 2; }
root=${FRESH_ROOT:-/var/tmp/clusterjob-fresh/root}
command -v mmdebstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap
stop_sandbox() {  # the root's local cluster runs on this machine's kernel: stopped at the end
    local cj=/root/clusterjob/.venv/bin/clusterjob
    if [ -x "$root$cj" ] && mountpoint -q "$root/proc"; then
        env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /usr/sbin/chroot "$root" "$cj" sandbox down \
            --purge >/dev/null 2>&1 || true
    fi
}
unmount_all() {
    for m in mnt/src sys dev proc; do
        mountpoint -q "$root/$m" && umount -R "$root/$m" || true
    done
}
trap 'stop_sandbox; unmount_all' EXIT
if [ "$rebuild" = 1 ] || [ ! -x "$root/bin/bash" ]; then
    unmount_all
    rm -rf "$root"
    mkdir -p "$(dirname "$root")"
    # git and ca-certificates: what a person has who cloned the project; nothing else
    mmdebstrap --variant=minbase --include=git,ca-certificates bookworm "$root"
fi
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mountpoint -q "$root/dev" || { mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"; }
mountpoint -q "$root/sys" || { mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"; }
mkdir -p "$root/mnt/src"
mountpoint -q "$root/mnt/src" || mount --bind -o ro "$src" "$root/mnt/src"
cp /etc/resolv.conf "$root/etc/resolv.conf"
[ -r /etc/ssl/certs/ca-certificates.crt ] &&
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
[ -r /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/pip.conf"
grep -q '^127.0.0.1 *localhost' "$root/etc/hosts" 2>/dev/null ||
    echo "127.0.0.1 localhost" >>"$root/etc/hosts"
grep -q " $(hostname)\$" "$root/etc/hosts" || echo "127.0.1.1 $(hostname)" >>"$root/etc/hosts"
env -i TERM=dumb TESTS="$tests" /usr/sbin/chroot "$root" /bin/bash -c '
set -euxo pipefail
export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
chmod 700 /root
cd /root
rm -rf clusterjob
git clone -q /mnt/src clusterjob
cd clusterjob
apt-get update -q && apt-get install -y -q python3-venv  # the README says to, first
bash scripts/quickstart.sh
if [ "$TESTS" = 1 ]; then
    bash scripts/test.sh
fi
'
echo "fresh Debian 12 root: the README's commands passed (root kept in $root)"
