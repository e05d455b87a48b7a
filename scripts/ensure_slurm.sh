#!/usr/bin/env bash
# A one-host Slurm cluster for the tests: scripts/ensure_slurm.sh start|stop DIR
#
# `start DIR` installs Debian's slurmctld, slurmd, the client commands and munge
# when they are missing (as root, with apt-get), writes a throw-away slurm.conf
# for this host into DIR (its cores and memory from `slurmd -C`, one partition,
# free ports, job records kept for 10 minutes after a job ends so squeue --json
# and scontrol still answer, job completion records in DIR/jobcomp.txt), starts
# munged, slurmctld and slurmd with their pid files, sockets, state and logs in
# DIR, waits until the node is idle, and prints `SLURM_CONF=DIR/slurm.conf` as
# its last line. Point the client commands at the cluster with that variable.
#
# `stop DIR` cancels every job of that cluster, then stops the daemons by the
# pids this script recorded in DIR (and nothing else).
#
# Exit status: 0 when the cluster is up (or stopped); 3 when it cannot be had
# here (not root and Slurm missing, no apt-get, a daemon that will not start),
# with the reason on the last line, so the tests that need it skip with that
# reason.
set -u

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
ACTION=$1
mkdir -p "$2" || exit 2
DIR=$(cd "$2" && pwd)
CONF="$DIR/slurm.conf"
PACKAGES=(slurmctld slurmd slurm-client munge)

# unavailable REASON: stop what this start began, say why, exit 3
unavailable() {
    [ "$ACTION" = start ] && stop_cluster
    echo "ensure_slurm: $*"
    exit 3
}

# pid_of NAME: the pid recorded in DIR/NAME.pid, when that process is alive
pid_of() {
    local pid
    pid=$(cat "$DIR/$1.pid" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

stop_cluster() {
    local name pid i alive
    if [ -f "$CONF" ] && pid_of slurmctld >/dev/null; then
        SLURM_CONF=$CONF scancel --full --quiet --user="$(id -un)" 2>/dev/null
        for i in $(seq 1 40); do  # up to 10 s for the jobs' steps to end
            [ -z "$(SLURM_CONF=$CONF squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.25
        done
    fi
    local pids=()
    for name in slurmd slurmctld munged; do
        pid=$(pid_of "$name") && pids+=("$pid")
    done
    [ ${#pids[@]} -eq 0 ] && return 0
    kill "${pids[@]}" 2>/dev/null
    for i in $(seq 1 100); do  # up to 10 s for all of them, then SIGKILL
        alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    kill -9 "${pids[@]}" 2>/dev/null
    return 0
}

install_packages() {
    command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
        && command -v sbatch >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 && return 0
    [ "$(id -u)" -eq 0 ] || unavailable "Slurm is not installed and we are not root (sudo apt-get install ${PACKAGES[*]})"
    command -v apt-get >/dev/null 2>&1 || unavailable "Slurm is not installed and apt-get is not available"
    echo "ensure_slurm: installing ${PACKAGES[*]} (apt-get)..."
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >"$DIR/apt.log" 2>&1; then
        apt-get update -qq >>"$DIR/apt.log" 2>&1
        apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >>"$DIR/apt.log" 2>&1 \
            || unavailable "could not install ${PACKAGES[*]}: $(tail -n 1 "$DIR/apt.log")"
    fi
}

free_ports() {
    python3 - <<'PYEOF'
import socket
sockets = [socket.socket() for _ in range(2)]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in sockets))
PYEOF
}

write_conf() {
    local user host node ports
    user=$(id -un)
    host=$(hostname -s)
    # this host as slurmd sees it (NodeName=... CPUs=... RealMemory=...), reachable on the loopback
    node=$(slurmd -C 2>/dev/null | head -n 1)
    [[ "$node" == NodeName=* ]] || unavailable "slurmd -C did not describe this host: ${node:-nothing}"
    read -r -a ports <<<"$(free_ports)"
    [ ${#ports[@]} -eq 2 ] || unavailable "no free ports for slurmctld and slurmd"
    cat >"$CONF" <<EOF
# a throw-away one-host cluster written by scripts/ensure_slurm.sh
ClusterName=workbench
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=${ports[0]}
SlurmdPort=${ports[1]}
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
# ended jobs stay known to squeue --json and scontrol for 10 minutes (no slurmdbd, so no sacct)
MinJobAge=600
KillWait=5
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.txt
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
}

start_munge() {
    mkdir -p "$DIR/munge" && chmod 755 "$DIR/munge"
    [ -f "$DIR/munge/munge.key" ] || head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
    chmod 600 "$DIR/munge/munge.key"
    munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
        --pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed" \
        >>"$DIR/log/start.log" 2>&1 || unavailable "munged did not start: $(tail -n 1 "$DIR/log/munged.log" 2>/dev/null)"
}

start_cluster() {
    local i state
    if pid_of slurmctld >/dev/null && pid_of slurmd >/dev/null; then
        echo "SLURM_CONF=$CONF"
        return 0
    fi
    install_packages
    stop_cluster
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
    write_conf
    start_munge
    export SLURM_CONF=$CONF
    slurmctld -i >>"$DIR/log/start.log" 2>&1 || unavailable "slurmctld did not start: $(tail -n 1 "$DIR/log/slurmctld.log" 2>/dev/null)"
    slurmd >>"$DIR/log/start.log" 2>&1 || unavailable "slurmd did not start: $(tail -n 1 "$DIR/log/slurmd.log" 2>/dev/null)"
    for i in $(seq 1 120); do  # up to 30 s for the node to register
        state=$(sinfo -h -o %t 2>/dev/null | head -n 1)
        [ "$state" = idle ] && break
        sleep 0.25
    done
    if [ "$state" != idle ]; then
        stop_cluster
        unavailable "the node did not become idle (sinfo: ${state:-no answer}); logs in $DIR/log"
    fi
    echo "SLURM_CONF=$CONF"
}

case $ACTION in
    start) start_cluster ;;
    stop) stop_cluster ;;
    *) usage ;;
esac
