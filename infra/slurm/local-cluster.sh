#!/usr/bin/env bash
# A one-host SLURM cluster on loopback for the `slurm` tests and for trying ballast's SLURM
# support: munged, slurmctld and slurmd started here (no systemd), Debian's slurm-wlm 22.05
# and munge installed beforehand (as root: apt-get install -y slurm-wlm munge).
#
#   infra/slurm/local-cluster.sh          # start it, or do nothing when it is up already
#   infra/slurm/local-cluster.sh stop     # stop the daemons this script started
#
# The node advertises what this host has (every CPU, 80% of its memory): the tests request
# 1-2 CPUs each, so the cluster never claims more than they ask for. Each job gets a private
# /tmp (job_container/tmpfs), as on most sites, so a job that needs a file of the submitting
# host's /tmp fails here as it would there. No accounting database: finished jobs are kept
# in slurmctld's memory for MinJobAge seconds (scontrol show job) and in the jobcomp file.
# A config not written by this script is never overwritten: the script stops instead.
set -euo pipefail

CONF_DIR=/etc/slurm
STATE_DIR=${BALLAST_SLURM_STATE:-/var/spool/ballast-slurm}
MARK="# written by ballast infra/slurm/local-cluster.sh"
HOST=$(hostname -s)

say() { echo "local-cluster: $*" >&2; }

node_up() {
    # The node answers and is idle, mixed or allocated (not down, drained or unknown).
    local state
    state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null | head -n 1) || return 1
    [[ $state =~ ^(idle|mixed|allocated|completing)$ ]]
}

write_conf() {
    # $1: file name under $CONF_DIR; the text on stdin. Refuses a file someone else wrote.
    local path="$CONF_DIR/$1" text
    text="$MARK"$'\n'"$(cat)"
    if [[ -e $path ]] && ! grep -qF "$MARK" "$path"; then
        say "$path exists and was not written by this script: leaving it, and stopping"
        exit 1
    fi
    [[ -e $path && $(cat "$path") == "$text" ]] || printf '%s\n' "$text" > "$path"
}

write_confs() {
    local cpus memory_mb
    cpus=$(nproc)
    memory_mb=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.8}' /proc/meminfo)
    mkdir -p "$CONF_DIR" "$STATE_DIR"/{ctld,d,tmpfs} /var/log/slurm
    chown -R slurm:slurm "$STATE_DIR/ctld" /var/log/slurm
    write_conf slurm.conf <<EOF
ClusterName=ballast-local
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/d
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
JobContainerType=job_container/tmpfs
PrologFlags=Contain
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
    write_conf cgroup.conf <<EOF
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
ConstrainSwapSpace=no
EOF
    write_conf job_container.conf <<EOF
AutoBasePath=true
BasePath=$STATE_DIR/tmpfs
EOF
}

start_munge() {
    if munge -n </dev/null >/dev/null 2>&1; then return; fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        mungekey --create --keyfile=/etc/munge/munge.key
    fi
    chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
    mkdir -p /run/munge && chown munge:munge /run/munge
    su -s /bin/sh munge -c /usr/sbin/munged
}

start() {
    if node_up; then say "SLURM is up on $HOST"; return; fi
    command -v slurmctld >/dev/null || { say "slurmctld not installed: apt-get install -y slurm-wlm munge"; exit 1; }
    write_confs
    start_munge
    pgrep -x slurmctld >/dev/null || slurmctld
    pgrep -x slurmd >/dev/null || slurmd
    for _ in $(seq 60); do
        if node_up; then say "SLURM is up on $HOST: $(sinfo -h -o '%P %D %c CPUs %m MB %T')"; return; fi
        sleep 1
    done
    say "the node did not become idle in 60 s; see /var/log/slurm/slurmctld.log and slurmd.log"
    exit 1
}

stop() {
    for daemon in slurmd slurmctld; do
        local pidfile="$STATE_DIR/$daemon.pid"
        [[ -s $pidfile ]] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
}

case "${1:-start}" in
    start) start ;;
    stop) stop ;;
    *) say "usage: $0 [start|stop]"; exit 2 ;;
esac
