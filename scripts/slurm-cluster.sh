#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for cellhost's Slurm placement
# tests (crates/placement/tests/slurm.rs): Debian's slurm-wlm and munge,
# this host as controller and compute node, no systemd.
#
#   scripts/slurm-cluster.sh up       install (apt-get, root only), configure, start; idempotent
#   scripts/slurm-cluster.sh down     cancel all jobs, stop slurmd, slurmctld, munged; no process left
#   scripts/slurm-cluster.sh status   exit 0 when the controller answers and the node is usable
#
# Everything lives under $CELLHOST_SLURM_DIR (default /var/tmp/cellhost-slurm):
# slurm.conf, cgroup.conf, the munge key and socket, state and spool dirs,
# pid files and logs (log/). Clients find the cluster through
# SLURM_CONF=$CELLHOST_SLURM_DIR/slurm.conf (the tests set it; the Slurm
# placement takes it as `slurm_conf`). Runs as root (slurmd must be root to
# start jobs as their users); works without a terminal (CI=true, no stdin).
#
# Process tracking: proctrack/cgroup (the job's cgroup v1 freezer hierarchy,
# so scancel reaches processes that left the job's process tree) when the
# machine has cgroup v1 with a freezer controller, else proctrack/linuxproc
# (process tree only). `status` prints which.
set -euo pipefail

DIR="${CELLHOST_SLURM_DIR:-/var/tmp/cellhost-slurm}"
CTLD_PORT="${CELLHOST_SLURM_CTLD_PORT:-6817}"
SLURMD_PORT="${CELLHOST_SLURM_SLURMD_PORT:-6818}"
CONF="$DIR/slurm.conf"
MUNGE_SOCKET="$DIR/munge/munge.socket.2"
export SLURM_CONF="$CONF"

say() { printf 'slurm-cluster: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

need_root() { [[ "$(id -u)" == 0 ]] || die "must run as root (slurmd starts jobs as their users)"; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sbatch >/dev/null && command -v munged >/dev/null; then
        return 0
    fi
    command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and apt-get is not available"
    say "apt-get install slurm-wlm munge"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq --no-install-recommends slurm-wlm munge </dev/null >/dev/null 2>&1; } \
        || { apt-get update -qq </dev/null && apt-get install -y -qq --no-install-recommends slurm-wlm munge </dev/null >/dev/null; } \
        || die "apt-get install slurm-wlm munge failed"
}

pid_alive() { # pidfile
    [[ -s "$1" ]] && kill -0 "$(cat -- "$1")" 2>/dev/null
}

# Waits (bounded) for a condition command to succeed.
wait_for() { # seconds description command...
    local limit="$1" what="$2"; shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || { say "timed out after ${limit}s waiting for $what"; return 1; }
        sleep 0.2
    done
}

proctrack_plugin() {
    if [[ -d /sys/fs/cgroup/freezer ]] && [[ "$(stat -f -c %T /sys/fs/cgroup)" == tmpfs ]]; then
        echo proctrack/cgroup
    else
        echo proctrack/linuxproc
    fi
}

write_config() {
    local host cpus mem proctrack
    host="$(hostname -s)"
    cpus="$(nproc)"
    # RealMemory in MiB, a little below the total so slurmd never drains the node.
    mem=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
    proctrack="$(proctrack_plugin)"
    mkdir -p "$DIR"/{munge,state,spool,run,log,jobs}
    chmod 0755 "$DIR"
    chmod 0700 "$DIR/munge" "$DIR/state" "$DIR/spool"
    # Job output and cellhost's per-user spool dirs (1777: each user's own subdir).
    chmod 1777 "$DIR/jobs"
    cat >"$CONF.new" <<EOF
# Written by scripts/slurm-cluster.sh: a one-node test cluster.
ClusterName=cellhost
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=$proctrack
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# Ended jobs stay visible to squeue for an hour (no accounting database here).
MinJobAge=3600
KillWait=5
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    mv -f "$CONF.new" "$CONF"
    cat >"$DIR/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
    # Debian's slurmd reads plugstack.conf next to slurm.conf.
    : >"$DIR/plugstack.conf"
    if [[ ! -s "$DIR/munge/munge.key" ]]; then
        (umask 077 && dd if=/dev/urandom of="$DIR/munge/munge.key.new" bs=1024 count=1 status=none)
        mv -f "$DIR/munge/munge.key.new" "$DIR/munge/munge.key"
    fi
    chmod 0600 "$DIR/munge/munge.key"
}

start_munge() {
    pid_alive "$DIR/run/munged.pid" && return 0
    rm -f -- "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    munged --force --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed" </dev/null
    wait_for 20 "munged" munge --socket="$MUNGE_SOCKET" -n
}

start_slurmctld() {
    pid_alive "$DIR/run/slurmctld.pid" && return 0
    # -c: no jobs of an earlier run come back (down cancelled them all).
    slurmctld -c -f "$CONF" </dev/null
    wait_for 30 "slurmctld" scontrol ping
}

node_usable() {
    local state
    state="$(sinfo -h -N -o %T 2>/dev/null | head -n1)"
    [[ "$state" == idle* || "$state" == mixed* || "$state" == allocated* ]]
}

start_slurmd() {
    pid_alive "$DIR/run/slurmd.pid" && return 0
    slurmd -f "$CONF" </dev/null
    if ! wait_for 30 "the node to become idle" node_usable; then
        sinfo -N -l >&2 || true
        tail -n 20 "$DIR/log/slurmd.log" >&2 || true
        return 1
    fi
}

up() {
    need_root
    local start=$SECONDS
    install_packages
    if status >/dev/null 2>&1; then
        say "already up ($CONF)"
        return 0
    fi
    write_config
    start_munge
    start_slurmctld
    start_slurmd
    say "up in $((SECONDS - start))s: SLURM_CONF=$CONF ($(proctrack_plugin))"
}

# Ends a daemon by pid file: SIGTERM, then SIGKILL after 15 s.
stop_pidfile() { # name pidfile
    local name="$1" file="$2" pid
    [[ -s "$file" ]] || return 0
    pid="$(cat -- "$file")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        if ! wait_for 15 "$name to exit" bash -c "! kill -0 $pid"; then
            kill -KILL "$pid" 2>/dev/null || true
            wait_for 5 "$name to die" bash -c "! kill -0 $pid" || true
        fi
    fi
    rm -f -- "$file"
}

# Processes started by this cluster's daemons that may outlive them.
leftovers() {
    pgrep -f -- "slurmstepd: \[" || true
}

# Every process still in a job cgroup of proctrack/cgroup (a job whose
# slurmstepd is gone), killed; then the empty cgroups removed.
kill_job_cgroups() {
    local root="/sys/fs/cgroup/freezer/slurm_$(hostname -s)" f p
    [[ -d "$root" ]] || return 0
    while IFS= read -r f; do
        echo THAWED >"$f" 2>/dev/null || true
    done < <(find "$root" -name freezer.state)
    while IFS= read -r f; do
        for p in $(cat -- "$f" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    done < <(find "$root" -name cgroup.procs)
    cgroups_empty() { [[ -z "$(find "$root" -name cgroup.procs -exec cat {} + 2>/dev/null)" ]]; }
    wait_for 10 "job processes to die" cgroups_empty || true
    find "$root" -depth -mindepth 1 -type d -exec rmdir {} + 2>/dev/null || true
}

down() {
    need_root
    if [[ -f "$CONF" ]] && pid_alive "$DIR/run/slurmctld.pid"; then
        # Every job of the test cluster ends with it (also on a half-up cluster).
        local ids
        ids="$(squeue -h -t pending,running,suspended,completing -o %i 2>/dev/null | tr '\n' ' ')"
        # shellcheck disable=SC2086
        [[ -z "${ids// /}" ]] || scancel $ids 2>/dev/null || true
        wait_for 20 "jobs to end" bash -c '[[ -z "$(squeue -h -t running,completing -o %i 2>/dev/null)" ]]' || true
    fi
    stop_pidfile slurmd "$DIR/run/slurmd.pid"
    stop_pidfile slurmctld "$DIR/run/slurmctld.pid"
    local p
    for p in $(leftovers); do kill -KILL "$p" 2>/dev/null || true; done
    kill_job_cgroups
    if pid_alive "$DIR/run/munged.pid"; then
        munged --stop --socket="$MUNGE_SOCKET" >/dev/null 2>&1 || true
        stop_pidfile munged "$DIR/run/munged.pid"
    fi
    rm -f -- "$DIR/run/munged.pid"
    say "down"
}

status() {
    [[ -f "$CONF" ]] || { echo "not configured ($CONF missing)"; return 1; }
    local d
    for d in munged slurmctld slurmd; do
        pid_alive "$DIR/run/$d.pid" || { echo "$d is not running"; return 1; }
    done
    scontrol ping >/dev/null 2>&1 || { echo "slurmctld does not answer"; return 1; }
    node_usable || { echo "the node is not usable: $(sinfo -h -N -o '%T %E' 2>&1 | head -n1)"; return 1; }
    echo "up: SLURM_CONF=$CONF $(grep '^ProctrackType=' "$CONF")"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
