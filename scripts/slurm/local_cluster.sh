#!/usr/bin/env bash
# A single-node Slurm on this machine, from the OS packages (Debian: apt-get install -y slurm-wlm munge),
# for trying the batch examples: munged, slurmctld and slurmd run as root with their config, state,
# logs and munge socket in STATE_DIR, talking over 127.0.0.1 only.
#
#   scripts/slurm/local_cluster.sh start STATE_DIR     # then: export SLURM_CONF=STATE_DIR/slurm.conf
#   scripts/slurm/local_cluster.sh stop STATE_DIR      # ends the daemons it started (by their recorded PIDs)
#
# Ports: SLURMCTLD_PORT (default 6817) and SLURMD_PORT (default 6818). CPUs: SLURM_CPUS (default: all).
set -euo pipefail
cmd=${1:?usage: $0 start|stop STATE_DIR}
state=${2:?usage: $0 start|stop STATE_DIR}

stop() {
  for name in slurmd slurmctld munged; do
    if [ -f "$state/$name.pid" ]; then
      pid=$(cat "$state/$name.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$state/$name.pid"
    fi
  done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: $0 start|stop STATE_DIR" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "$0: the Slurm daemons run as root here; run it as root" >&2; exit 1; }
for tool in munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || { echo "$0: $tool is not installed (apt-get install -y slurm-wlm munge)" >&2; exit 1; }
done

mkdir -p "$state"
state=$(cd "$state" && pwd)
chmod 700 "$state"
mkdir -p "$state/ctld" "$state/spool"
node=$(hostname -s)
cpus=${SLURM_CPUS:-$(nproc)}

# munge: a key of our own and a socket in the state folder
[ -f "$state/munge.key" ] || { head -c 1024 /dev/urandom > "$state/munge.key"; chmod 400 "$state/munge.key"; }
munged --foreground --force --socket="$state/munge.sock" --key-file="$state/munge.key" --log-file="$state/munged.log" \
  --pid-file="$state/munged.pid.own" --seed-file="$state/munged.seed" >/dev/null 2>&1 &
echo $! > "$state/munged.pid"

cat > "$state/slurm.conf" <<CONF
ClusterName=avatar
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=${SLURMCTLD_PORT:-6817}
SlurmdPort=${SLURMD_PORT:-6818}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$state/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid.own
SlurmdPidFile=$state/slurmd.pid.own
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$state/slurm.conf"

for _ in $(seq 50); do [ -S "$state/munge.sock" ] && break; sleep 0.1; done
[ -S "$state/munge.sock" ] || { echo "$0: munged did not start; see $state/munged.log" >&2; stop; exit 1; }
slurmctld -D -i > "$state/slurmctld.out" 2>&1 &
echo $! > "$state/slurmctld.pid"
slurmd -D -N "$node" > "$state/slurmd.out" 2>&1 &
echo $! > "$state/slurmd.pid"

for _ in $(seq 120); do
  if sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    echo "Slurm is up: node $node, $cpus CPUs, partition local (export SLURM_CONF=$state/slurm.conf)"
    exit 0
  fi
  sleep 0.5
done
echo "$0: the node did not come up; see $state/slurmctld.log and $state/slurmd.log" >&2
sinfo -N -l >&2 || true
stop
exit 1
