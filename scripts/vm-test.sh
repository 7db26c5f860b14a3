#!/usr/bin/env bash
# Release check on a host that is not this machine: a Debian 12 guest with
# systemd and cgroup v2 under qemu runs the escape suite, the limits tests,
# the template tests and the W2/W2T bench, as root and as a non-root user
# with a systemd user manager (lingering user, the way a login session has
# one), and prints the capability table (`cellhost doctor --json` and the
# `capability` lines of the cgroup-limits tests) for both.
#
# Needs root. Installs mmdebstrap, qemu-system-x86 and e2fsprogs with apt-get
# when missing. Builds and caches under CELLHOST_VM_CACHE (default
# /var/tmp/cellhost-vm):
#   debian12-<key>/  the guest: rootfs.img (ext4), vmlinuz, initrd.img; <key>
#                    hashes the guest recipe below, so a changed recipe builds
#                    a new guest and an unchanged one is reused
#   venv-<key>/      a venv from /usr/bin/python3 (the guest has the same
#                    Debian python) with numpy, pandas and matplotlib at the
#                    pins of python/requirements.txt, shared into the guest
#   last/            the last run's logs, results and capability table
# Builds `cargo build --release -p cellhost -p cellhost-bench` and the test
# binaries (escape suite, kernel tests) in this checkout, shares them into the
# guest over 9p (read-only), boots it with a throw-away overlay of the image
# (-snapshot), and reads the results from a writable 9p share as they come:
# a guest that runs out of time still leaves the suites it finished.
#
# CELLHOST_VM_PHASES (default "doctor,cgroup_limits limits,templates,bench,
# escape") and CELLHOST_VM_WHO (default "root,user") run a part again; the
# phase "disk" runs only the escape suite's `disk_mb` tests.
# CELLHOST_VM_BINARIES=DIR takes cellhost, cellhost-bench, escape, kernel and
# cgroup_limits from DIR instead of building them.
# CPU: CELLHOST_VM_ACCEL=auto (default) | kvm | tcg. `auto` takes KVM when
# the host's /dev/kvm is hardware virtualisation (kvm_intel, kvm_amd) and
# emulates the CPU (TCG) otherwise. A /dev/kvm served by kvm_pvm
# (pagetable-based virtualisation, how microVM hosts without nested VMX/SVM
# offer KVM) runs only guest kernels built as PVM guests (CONFIG_PVM_GUEST,
# CONFIG_X86_PIE) by direct kernel boot: Debian's stock kernel stalls there
# right after the real-mode setup ("Probing EDD"), so `auto` uses TCG.
# CELLHOST_VM_CPUS (default 1) vCPUs, CELLHOST_VM_MEM_MIB (default 6144; the
# memory test needs more than the default 4 GiB limit), CELLHOST_VM_TIMEOUT
# seconds for the guest (default 3600 with KVM, 14400 with TCG).
# Usage: scripts/vm-test.sh [--image-only]
# Exit: 0 when every suite passed as root and as the user; 1 when one failed
# or did not finish; 2 for a setup error (no root, the guest could not be
# built or did not boot).
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
say() { printf '\n==> %s\n' "$*" >&2; }
die() { echo "vm-test: $*" >&2; exit 2; }
now() { date +%s; }
T0="$(now)"

[[ "$(id -u)" == 0 ]] || die "run as root (it builds a guest image and starts qemu)"
IMAGE_ONLY=0
[[ "${1:-}" == "--image-only" ]] && IMAGE_ONLY=1

CACHE="${CELLHOST_VM_CACHE:-/var/tmp/cellhost-vm}"
MEM_MIB="${CELLHOST_VM_MEM_MIB:-6144}"
CPUS="${CELLHOST_VM_CPUS:-1}"
CELLHOST_VM_WHO="${CELLHOST_VM_WHO:-root,user}"

# ---------------------------------------------------------------- accelerator
# Which KVM this host has: hw (VMX/SVM), pvm (kvm_pvm), unknown (/dev/kvm
# without a module we know) or none.
kvm_kind() {
    if [[ ! -c /dev/kvm ]]; then echo none
    elif [[ -d /sys/module/kvm_intel || -d /sys/module/kvm_amd ]]; then echo hw
    elif [[ -d /sys/module/kvm_pvm ]]; then echo pvm
    else echo unknown
    fi
}
KVM_KIND="$(kvm_kind)"
ACCEL_MODE="${CELLHOST_VM_ACCEL:-auto}"
case "$ACCEL_MODE" in
    auto)
        case "$KVM_KIND" in
            hw | unknown) ACCEL_MODE=kvm ;;
            pvm) ACCEL_MODE=tcg
                say "/dev/kvm is kvm_pvm: it runs only PVM guest kernels, Debian's kernel stalls there; emulating the CPU (TCG)" ;;
            none) ACCEL_MODE=tcg; say "no /dev/kvm: emulating the CPU (TCG)" ;;
        esac ;;
    kvm)
        [[ "$KVM_KIND" != none ]] || die "CELLHOST_VM_ACCEL=kvm but /dev/kvm is missing"
        [[ "$KVM_KIND" != pvm ]] || say "warning: /dev/kvm is kvm_pvm; Debian's stock kernel stalls after \"Probing EDD\" there" ;;
    tcg) ;;
    *) die "CELLHOST_VM_ACCEL=$ACCEL_MODE: expected auto, kvm or tcg" ;;
esac
if [[ "$ACCEL_MODE" == tcg ]]; then
    ACCEL=(-accel tcg -cpu max)
    GUEST_TIMEOUT="${CELLHOST_VM_TIMEOUT:-14400}"
else
    ACCEL=(-accel kvm -cpu "${CELLHOST_VM_CPU:-host}")
    GUEST_TIMEOUT="${CELLHOST_VM_TIMEOUT:-3600}"
fi
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
# curl: the escape suite drives `cellhost serve` with it.
GUEST_PACKAGES="systemd,systemd-sysv,systemd-container,dbus,dbus-user-session,libpam-systemd,udev,kmod,procps,util-linux,linux-image-amd64,initramfs-tools,python3,curl"
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
# The last field is the revision of the customize hooks above: bump it when one changes.
KEY="$(printf '%s\n' bookworm "$GUEST_PACKAGES" "$GUEST_UNIT" "$GUEST_FSTAB" 2 | sha256sum | cut -c1-12)"
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
        --customize-hook='printf "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n127.0.1.1 cellhost-vm\n" > "$1/etc/hosts"' \
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
t="$(now)"
if [[ -n "${CELLHOST_VM_BINARIES:-}" ]]; then
    # Binaries built before (say the release artifacts to ship): cellhost,
    # cellhost-bench and the test executables escape, kernel, cgroup_limits.
    say "binaries from $CELLHOST_VM_BINARIES (no build)"
    B="$CELLHOST_VM_BINARIES"
    CELLHOST_BIN="$B/cellhost" BENCH_BIN="$B/cellhost-bench"
    ESCAPE_BIN="$B/escape" KERNEL_BIN="$B/kernel" CGROUP_BIN="$B/cgroup_limits"
else
    say "cargo build --release -p cellhost -p cellhost-bench; the escape suite and the kernel tests"
    LOCKED=()
    [[ -f Cargo.lock ]] && LOCKED=(--locked)
    cargo build "${LOCKED[@]}" --release -p cellhost -p cellhost-bench
    test_bin() { # crate test-target
        cargo test "${LOCKED[@]}" -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null \
            | /usr/bin/python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$2"
    }
    CELLHOST_BIN=target/release/cellhost BENCH_BIN=target/release/cellhost-bench
    ESCAPE_BIN="$(test_bin cellhost escape)"
    KERNEL_BIN="$(test_bin cellhost-kernel kernel)"
    CGROUP_BIN="$(test_bin cellhost-kernel cgroup_limits)"
fi
for b in "$ESCAPE_BIN" "$KERNEL_BIN" "$CGROUP_BIN" "$CELLHOST_BIN" "$BENCH_BIN"; do
    [[ -x "$b" ]] || die "no binary $b"
done
T_BUILD=$(( $(now) - t ))

RUN="$(mktemp -d "$CACHE/run.XXXXXX")"
trap 'rm -rf -- "$RUN"' EXIT
SHARE="$RUN/share"
OUT="$RUN/out"
mkdir -p "$SHARE" "$OUT"
cp -- "$CELLHOST_BIN" "$SHARE/cellhost"
cp -- "$BENCH_BIN" "$SHARE/cellhost-bench"
cp -- "$ESCAPE_BIN" "$SHARE/escape"
cp -- "$KERNEL_BIN" "$SHARE/kernel"
cp -- "$CGROUP_BIN" "$SHARE/cgroup_limits"
chmod -R a+rX "$SHARE"
chmod 1777 "$OUT"

# The suites, run by the guest as root and as `tester`, one phase at a time.
cat > "$SHARE/suites.sh" <<'EOF'
#!/bin/bash
# suites.sh WHO SUITE...: runs the suites as the calling user; one line per
# suite in $OUT/<who>.rc (name, exit status, seconds), the output in
# $OUT/<who>.<suite>.log.
set -u
WHO="$1"; shift
OUT=/mnt/out
PY=/opt/cellhost-venv/bin/python
export CELLHOST_TEST_PYTHON="$PY"
export CELLHOST_TEST_BIN=/mnt/cellhost/cellhost
export PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8
WORK="$(mktemp -d)"
cd "$WORK"
echo "== $WHO: uid $(id -u), $(cat /proc/self/cgroup), XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-}"
suite() { # name command...
    local name="$1"; shift
    local t0; t0=$(date +%s)
    echo "-- $WHO $name: $*"
    "$@" > "$OUT/$WHO.$name.log" 2>&1
    local rc=$?
    echo "$name $rc $(( $(date +%s) - t0 ))s" >> "$OUT/$WHO.rc"
    tail -n 3 "$OUT/$WHO.$name.log"
    sync
}
for s in "$@"; do
    case "$s" in
        doctor) suite doctor sh -c "/mnt/cellhost/cellhost doctor --json --python $PY > $OUT/$WHO.doctor.json" ;;
        cgroup_limits) suite cgroup_limits /mnt/cellhost/cgroup_limits --test-threads=1 --nocapture ;;
        limits) suite limits /mnt/cellhost/kernel --test-threads=1 hk22 hk23 sandbox_fork_beyond ;;
        templates) suite templates /mnt/cellhost/kernel --test-threads=1 template_ ;;
        bench) suite bench /mnt/cellhost/cellhost bench --workload W2,W2T --kernels "${CELLHOST_VM_KERNELS:-5}" \
                   --python "$PY" --output "$OUT/$WHO.bench.md" ;;
        escape) suite escape /mnt/cellhost/escape --test-threads=1 ;;
        disk) suite disk /mnt/cellhost/escape --test-threads=1 disk_mb ;;
        *) echo "suites.sh: no suite $s" >&2 ;;
    esac
done
cd /; rm -rf "$WORK"
EOF
cat > "$SHARE/guest-run.sh" <<'EOF'
#!/bin/bash
# In the guest (cellhost-vm-test.service): each phase as root, then as the
# user, so the cheap phases (and the capability table) come first.
set -u
OUT=/mnt/out
exec > >(tee "$OUT/console.log") 2>&1
echo "guest: $(uname -r), $(systemctl --version | head -1), cgroup $(stat -fc %T /sys/fs/cgroup), $(nproc) CPU"
date +%s > "$OUT/t_booted"
# A systemd user manager for uid 1000, as a login session has one.
loginctl enable-linger tester
systemctl start user@1000.service
as_user() {
    systemd-run -M tester@ --user --wait --pipe --quiet \
        -E CELLHOST_VM_KERNELS="${CELLHOST_VM_KERNELS:-5}" -- /bin/bash /mnt/cellhost/suites.sh user "$@" < /dev/null
    local rc=$?
    ((rc == 0)) || echo "user-run($*) $rc" >> "$OUT/user.rc"
}
# One phase a line (suites run together), then who runs them.
mapfile -t PHASES < /mnt/cellhost/phases
read -r -a WHO < /mnt/cellhost/who
for phase in "${PHASES[@]}"; do
    for who in "${WHO[@]}"; do
        # shellcheck disable=SC2086
        if [[ "$who" == root ]]; then bash /mnt/cellhost/suites.sh root $phase; else as_user $phase; fi
    done
done
date +%s > "$OUT/t_done"
sync
# Power off now: the disk is a throw-away overlay and the results are
# synced; an orderly shutdown under emulation can take minutes.
echo o > /proc/sysrq-trigger
EOF
chmod a+rx "$SHARE"/*.sh
# CELLHOST_VM_PHASES: comma-separated phases, each one or more suites
# separated by spaces; CELLHOST_VM_WHO: root, user or both (a rerun of a part).
tr ',' '\n' <<< "${CELLHOST_VM_PHASES:-doctor,cgroup_limits limits,templates,bench,escape}" > "$SHARE/phases"
tr ',' ' ' <<< "${CELLHOST_VM_WHO:-root,user}" > "$SHARE/who"
chmod a+r "$SHARE/phases" "$SHARE/who"

say "boot the guest ($ACCEL_MODE, $CPUS vCPU, ${MEM_MIB} MiB; at most ${GUEST_TIMEOUT}s)"
t="$(now)"
timeout "$GUEST_TIMEOUT" qemu-system-x86_64 "${ACCEL[@]}" -smp "$CPUS" -m "$MEM_MIB" -nographic -no-reboot \
    -kernel "$GUEST/vmlinuz" -initrd "$GUEST/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 panic=-1 systemd.unified_cgroup_hierarchy=1 systemd.show_status=0 loglevel=3" \
    -drive "file=$GUEST/rootfs.img,if=virtio,format=raw" -snapshot \
    -virtfs "local,path=$SHARE,mount_tag=cellhost,security_model=none,readonly=on" \
    -virtfs "local,path=$VENV,mount_tag=venv,security_model=none,readonly=on" \
    -virtfs "local,path=$OUT,mount_tag=out,security_model=none" \
    -nic none < /dev/null > "$RUN/serial.log" 2>&1 || true
T_RUN=$(( $(now) - t ))

rm -rf -- "$CACHE/last"
mkdir -p "$CACHE/last"
cp -r -- "$OUT/." "$CACHE/last/"
cp -- "$RUN/serial.log" "$CACHE/last/serial.log"
[[ -f "$OUT/t_booted" ]] || { tail -n 40 "$RUN/serial.log" >&2; die "the guest did not reach its test unit (serial log above)"; }
FINISHED=1
[[ -f "$OUT/t_done" ]] || { FINISHED=0; echo "vm-test: the guest ran out of time (${GUEST_TIMEOUT}s); the results so far follow" >&2; }

say "capability table ($CACHE/last/capabilities.md)"
/usr/bin/python3 scripts/vm-capabilities.py "$OUT" "$ACCEL_MODE" "$CPUS" > "$CACHE/last/capabilities.md"
cat "$CACHE/last/capabilities.md"

say "results"
status=0
((FINISHED)) || status=1
for who in ${CELLHOST_VM_WHO//,/ }; do
    [[ -f "$OUT/$who.rc" ]] || { echo "$who: no results"; status=1; continue; }
    while read -r name rc secs; do
        printf '%-6s %-14s rc=%s %s\n' "$who" "$name" "$rc" "${secs:-}"
        # doctor exits 1 when a layer is missing: that is the table, not a failure.
        [[ "$rc" == 0 || "$name" == doctor ]] || status=1
    done < "$OUT/$who.rc"
done
for who in ${CELLHOST_VM_WHO//,/ }; do
    for f in "$OUT/$who".*.log; do
        [[ -f "$f" ]] || continue
        if grep -q "test result: FAILED" "$f"; then
            echo "--- $(basename "$f"): failures"
            grep -E "^test .* FAILED|^---- " "$f" | head -20
        fi
    done
done
BOOTED="$(cat "$OUT/t_booted" 2>/dev/null || echo 0)"
DONE="$(cat "$OUT/t_done" 2>/dev/null || now)"
echo "timing: guest image ${T_IMAGE}s (0 = cached), build ${T_BUILD}s, boot+suites+poweroff ${T_RUN}s (suites $((DONE - BOOTED))s), total $(( $(now) - T0 ))s ($ACCEL_MODE, $CPUS vCPU)"
echo "logs: $CACHE/last"
exit "$status"
