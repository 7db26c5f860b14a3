#!/usr/bin/env bash
# Release check on a host that is not this machine: a Debian 12 guest with
# systemd and cgroup v2 under qemu/KVM runs the escape suite, the limits tests
# and the template tests, as root and as a non-root user with a systemd user
# manager (lingering user, the way a login session has one), and prints the
# capability table (`cellhost doctor --json`) for both.
#
# Needs root and /dev/kvm. Installs mmdebstrap, qemu-system-x86 and e2fsprogs
# with apt-get when missing. Builds and caches under CELLHOST_VM_CACHE
# (default /var/tmp/cellhost-vm):
#   debian12-<key>/  the guest: rootfs.img (ext4), vmlinuz, initrd.img; <key>
#                    hashes the guest recipe below, so a changed recipe builds
#                    a new guest and an unchanged one is reused
#   venv-<key>/      a venv from /usr/bin/python3 (the guest has the same
#                    Debian python) with numpy, pandas and matplotlib at the
#                    pins of python/requirements.txt, shared into the guest
# Builds `cargo build --release -p cellhost` and the test binaries (escape
# suite, kernel tests) in this checkout, shares them into the guest over 9p
# (read-only), boots it with a throw-away overlay of the image (-snapshot), and
# reads the results from a writable 9p share.
#
# The guest gets CELLHOST_VM_TIMEOUT seconds (default 3600) to finish;
# CELLHOST_VM_ACCEL=tcg emulates the CPU where KVM cannot run the guest.
# Usage: scripts/vm-test.sh [--image-only]
# Exit: 0 when every suite passed as root and as the user; 1 when one failed;
# 2 for a setup error (no root, no KVM, the guest could not be built or booted).
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
say() { printf '\n==> %s\n' "$*" >&2; }
die() { echo "vm-test: $*" >&2; exit 2; }
now() { date +%s; }
T0="$(now)"

[[ "$(id -u)" == 0 ]] || die "run as root (it builds a guest image and starts qemu with KVM)"
[[ -c /dev/kvm ]] || die "/dev/kvm is missing: the guest needs KVM"
IMAGE_ONLY=0
[[ "${1:-}" == "--image-only" ]] && IMAGE_ONLY=1

CACHE="${CELLHOST_VM_CACHE:-/var/tmp/cellhost-vm}"
MEM_MIB="${CELLHOST_VM_MEM_MIB:-6144}"
mkdir -p "$CACHE"

# ---------------------------------------------------------------- tools
need=()
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
if ((${#need[@]})); then
    say "apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    if ! apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}"; then
        # A newer qemu-utils from backports on the host breaks the stable
        # qemu-system; take qemu-system from the same backports then.
        . /etc/os-release
        echo "deb http://deb.debian.org/debian ${VERSION_CODENAME}-backports main" \
            > /etc/apt/sources.list.d/cellhost-vm-backports.list
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
            -t "${VERSION_CODENAME}-backports" "${need[@]}"
    fi
fi

# ---------------------------------------------------------------- the guest
GUEST_PACKAGES="systemd,systemd-sysv,systemd-container,dbus,dbus-user-session,libpam-systemd,udev,kmod,procps,util-linux,linux-image-amd64,initramfs-tools,python3"
read -r -d '' GUEST_UNIT <<'EOF' || true
[Unit]
Description=cellhost release check
After=multi-user.target systemd-logind.service mnt-cellhost.mount mnt-out.mount opt-cellhost\x2dvenv.mount
Requires=mnt-cellhost.mount mnt-out.mount
[Service]
Type=oneshot
ExecStart=/bin/bash /mnt/cellhost/guest-run.sh
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity
SuccessAction=poweroff-force
FailureAction=poweroff-force
[Install]
WantedBy=multi-user.target
EOF
read -r -d '' GUEST_FSTAB <<'EOF' || true
/dev/vda / ext4 rw,errors=remount-ro 0 1
cellhost /mnt/cellhost 9p trans=virtio,version=9p2000.L,ro 0 0
venv /opt/cellhost-venv 9p trans=virtio,version=9p2000.L,ro 0 0
out /mnt/out 9p trans=virtio,version=9p2000.L,rw 0 0
EOF
KEY="$(printf '%s\n' bookworm "$GUEST_PACKAGES" "$GUEST_UNIT" "$GUEST_FSTAB" 1 | sha256sum | cut -c1-12)"
GUEST="$CACHE/debian12-$KEY"
T_IMAGE=0
if [[ ! -f "$GUEST/rootfs.img" ]]; then
    say "build the guest $GUEST (mmdebstrap bookworm + systemd + linux-image-amd64)"
    t="$(now)"
    rm -rf -- "$GUEST.tmp"
    mkdir -p "$GUEST.tmp"
    TREE="$GUEST.tmp/tree"
    printf '%s\n' "$GUEST_UNIT" > "$GUEST.tmp/cellhost-vm-test.service"
    printf '%s\n' "$GUEST_FSTAB" > "$GUEST.tmp/fstab"
    mmdebstrap --mode=root --variant=apt --aptopt='APT::Install-Recommends "false"' \
        --include="$GUEST_PACKAGES" \
        --customize-hook='echo cellhost-vm > "$1/etc/hostname"' \
        --customize-hook="cp $GUEST.tmp/fstab \"\$1/etc/fstab\"" \
        --customize-hook='mkdir -p "$1/mnt/cellhost" "$1/mnt/out" "$1/opt/cellhost-venv"' \
        --customize-hook="cp $GUEST.tmp/cellhost-vm-test.service \"\$1/etc/systemd/system/\"" \
        --customize-hook='chroot "$1" systemctl enable cellhost-vm-test.service' \
        --customize-hook='chroot "$1" useradd -m -u 1000 -s /bin/bash tester' \
        --customize-hook='chroot "$1" passwd -d root' \
        --customize-hook='echo 9p >> "$1/etc/modules"; echo 9pnet_virtio >> "$1/etc/modules"' \
        bookworm "$TREE" || die "mmdebstrap failed"
    cp -L -- "$TREE/vmlinuz" "$GUEST.tmp/vmlinuz" || cp -- "$TREE"/boot/vmlinuz-* "$GUEST.tmp/vmlinuz"
    cp -L -- "$TREE/initrd.img" "$GUEST.tmp/initrd.img" || cp -- "$TREE"/boot/initrd.img-* "$GUEST.tmp/initrd.img"
    mkfs.ext4 -q -F -L root -d "$TREE" "$GUEST.tmp/rootfs.img" 4G || die "mkfs.ext4 -d failed"
    rm -rf -- "$TREE"
    mv -- "$GUEST.tmp" "$GUEST"
    T_IMAGE=$(( $(now) - t ))
    say "guest built in ${T_IMAGE}s"
fi
((IMAGE_ONLY)) && { echo "vm-test: guest image at $GUEST"; exit 0; }

# ---------------------------------------------------------------- venv
pin() { grep -E "^$1==" python/requirements.txt | head -1; }
PINS=("$(pin numpy)" "$(pin pandas)" "$(pin matplotlib)")
VKEY="$(printf '%s\n' /usr/bin/python3 "${PINS[@]}" | sha256sum | cut -c1-12)"
VENV="$CACHE/venv-$VKEY"
if [[ ! -x "$VENV/bin/python" ]]; then
    say "venv $VENV (${PINS[*]})"
    rm -rf -- "$VENV.tmp"
    /usr/bin/python3 -m venv "$VENV.tmp"
    "$VENV.tmp/bin/python" -m pip install -q --disable-pip-version-check "${PINS[@]}"
    chmod -R a+rX "$VENV.tmp"
    mv -- "$VENV.tmp" "$VENV"
fi

# ---------------------------------------------------------------- binaries
say "cargo build --release -p cellhost; the escape suite and the kernel tests"
t="$(now)"
LOCKED=()
[[ -f Cargo.lock ]] && LOCKED=(--locked)
cargo build "${LOCKED[@]}" --release -p cellhost
test_bin() { # crate test-target
    cargo test "${LOCKED[@]}" -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null \
        | /usr/bin/python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$2"
}
ESCAPE_BIN="$(test_bin cellhost escape)"
KERNEL_BIN="$(test_bin cellhost-kernel kernel)"
CGROUP_BIN="$(test_bin cellhost-kernel cgroup_limits)"
for b in "$ESCAPE_BIN" "$KERNEL_BIN" "$CGROUP_BIN" target/release/cellhost; do
    [[ -x "$b" ]] || die "no binary $b"
done
T_BUILD=$(( $(now) - t ))

RUN="$(mktemp -d "$CACHE/run.XXXXXX")"
trap 'rm -rf -- "$RUN"' EXIT
SHARE="$RUN/share"
OUT="$RUN/out"
mkdir -p "$SHARE" "$OUT"
cp -- target/release/cellhost "$SHARE/cellhost"
cp -- "$ESCAPE_BIN" "$SHARE/escape"
cp -- "$KERNEL_BIN" "$SHARE/kernel"
cp -- "$CGROUP_BIN" "$SHARE/cgroup_limits"
chmod -R a+rX "$SHARE"
chmod 1777 "$OUT"

# The suites, run by the guest as root and then as `tester`.
cat > "$SHARE/suites.sh" <<'EOF'
#!/bin/bash
# Runs every suite as the calling user; one line per suite in $OUT/<who>.rc.
set -u
WHO="$1"
OUT=/mnt/out
export CELLHOST_TEST_PYTHON=/opt/cellhost-venv/bin/python
export CELLHOST_TEST_BIN=/mnt/cellhost/cellhost
export PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8
WORK="$(mktemp -d)"
cd "$WORK"
echo "== $WHO: uid $(id -u), $(cat /proc/self/cgroup)"
/mnt/cellhost/cellhost doctor --json > "$OUT/$WHO.doctor.json" 2> "$OUT/$WHO.doctor.err"
echo "doctor $?" >> "$OUT/$WHO.rc"
suite() { # name binary args...
    local name="$1"; shift
    local t0; t0=$(date +%s)
    "$@" > "$OUT/$WHO.$name.log" 2>&1
    local rc=$?
    echo "$name $rc $(( $(date +%s) - t0 ))s" >> "$OUT/$WHO.rc"
    tail -n 3 "$OUT/$WHO.$name.log"
}
suite cgroup_limits /mnt/cellhost/cgroup_limits --test-threads=1 --nocapture
suite limits /mnt/cellhost/kernel --test-threads=1 hk22 hk23 sandbox_fork_beyond
suite templates /mnt/cellhost/kernel --test-threads=1 template_
suite escape /mnt/cellhost/escape --test-threads=2
cd /; rm -rf "$WORK"
EOF
cat > "$SHARE/guest-run.sh" <<'EOF'
#!/bin/bash
# In the guest (cellhost-vm-test.service): root first, then the user.
set -u
OUT=/mnt/out
exec > >(tee "$OUT/console.log") 2>&1
echo "guest: $(uname -r), $(systemctl --version | head -1), cgroup $(stat -fc %T /sys/fs/cgroup)"
date +%s > "$OUT/t_booted"
bash /mnt/cellhost/suites.sh root
# A systemd user manager for uid 1000, as a login session has one.
loginctl enable-linger tester
systemctl start user@1000.service
systemd-run -M tester@ --user --wait --pipe --quiet -- /bin/bash /mnt/cellhost/suites.sh user < /dev/null
echo "user-run $?" >> "$OUT/user.rc"
date +%s > "$OUT/t_done"
sync
EOF
chmod a+rx "$SHARE"/*.sh

say "boot the guest (KVM, ${MEM_MIB} MiB, 2 CPUs)"
t="$(now)"
# CELLHOST_VM_ACCEL=tcg: software emulation, where nested KVM stalls the guest.
if [[ "${CELLHOST_VM_ACCEL:-kvm}" == tcg ]]; then
    ACCEL=(-accel tcg -cpu max)
else
    ACCEL=(-enable-kvm -cpu "${CELLHOST_VM_CPU:-host,arch-capabilities=off,pmu=off}")
fi
timeout "${CELLHOST_VM_TIMEOUT:-3600}" qemu-system-x86_64 "${ACCEL[@]}" -smp 2 -m "$MEM_MIB" -nographic -no-reboot \
    -kernel "$GUEST/vmlinuz" -initrd "$GUEST/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 systemd.show_status=0 loglevel=3" \
    -drive "file=$GUEST/rootfs.img,if=virtio,format=raw" -snapshot \
    -virtfs "local,path=$SHARE,mount_tag=cellhost,security_model=none,readonly=on" \
    -virtfs "local,path=$VENV,mount_tag=venv,security_model=none,readonly=on" \
    -virtfs "local,path=$OUT,mount_tag=out,security_model=none" \
    -nic none < /dev/null > "$RUN/serial.log" 2>&1 || true
T_RUN=$(( $(now) - t ))

[[ -f "$OUT/t_done" ]] || { tail -n 40 "$RUN/serial.log" >&2; die "the guest did not finish (serial log above)"; }
mkdir -p "$CACHE/last"
cp -r -- "$OUT/." "$CACHE/last/"
cp -- "$RUN/serial.log" "$CACHE/last/serial.log"

say "capability table (cellhost doctor --json in the guest)"
/usr/bin/python3 - "$OUT" <<'EOF'
import json, sys, os
out = sys.argv[1]
cols = {}
for who in ("root", "user"):
    try:
        cols[who] = json.load(open(os.path.join(out, f"{who}.doctor.json")))
    except Exception as e:
        cols[who] = {"error": str(e)}
def layer(d, name):
    for l in d.get("layers", []):
        if l.get("name") == name:
            return ("enforced" if l.get("enforced") else "MISSING") + ": " + l.get("detail", "")[:90]
    return "-"
names = []
for d in cols.values():
    for l in d.get("layers", []):
        if l["name"] not in names:
            names.append(l["name"])
print(f"{'layer':<14} | {'root v2':<60} | non-root v2")
for n in names:
    print(f"{n:<14} | {layer(cols['root'], n):<60} | {layer(cols['user'], n)}")
for who, d in cols.items():
    for c in d.get("checks", []):
        print(f"check {who}: {c}")
EOF

say "results"
status=0
for who in root user; do
    [[ -f "$OUT/$who.rc" ]] || { echo "$who: no results"; status=1; continue; }
    while read -r name rc secs; do
        printf '%-6s %-14s rc=%s %s\n' "$who" "$name" "$rc" "${secs:-}"
        [[ "$rc" == 0 || "$name" == doctor ]] || status=1
    done < "$OUT/$who.rc"
done
for who in root user; do
    for f in "$OUT/$who".*.log; do
        [[ -f "$f" ]] || continue
        if grep -q "test result: FAILED" "$f"; then
            echo "--- $(basename "$f"): failures"
            grep -E "^test .* FAILED|^---- " "$f" | head -20
        fi
    done
done
BOOTED="$(cat "$OUT/t_booted" 2>/dev/null || echo 0)"
DONE="$(cat "$OUT/t_done" 2>/dev/null || echo 0)"
echo "timing: guest image ${T_IMAGE}s (0 = cached), build ${T_BUILD}s, boot+suites+poweroff ${T_RUN}s (suites $((DONE - BOOTED))s), total $(( $(now) - T0 ))s"
echo "logs: $CACHE/last"
exit "$status"
