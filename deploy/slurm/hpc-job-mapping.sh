#!/bin/sh
# Slurm Prolog and Epilog: dcgm-exporter's HPC job mapping (one file per GPU index, named by the index, holding
# the ids of the jobs on that GPU, one a line), so every DCGM metric of a GPU carries hpc_job="<slurm job id>"
# and Nightshift's GPU alerts name the job. Run by slurmd as root on the compute node:
#
#   slurm.conf:     Prolog=/etc/slurm/hpc-job-mapping.sh
#                   Epilog=/etc/slurm/hpc-job-mapping.sh
#   dcgm-exporter:  --hpc-job-mapping-dir=/run/dcgm-hpc-jobs
#
# Mode: $1 (prolog | epilog), else Slurm's SLURM_SCRIPT_CONTEXT (prolog_slurmd | epilog_slurmd).
# Configuration: the file named like this script with .conf instead of .sh (e.g. /etc/slurm/hpc-job-mapping.conf),
# shell assignments, read when present (slurmd gives prolog and epilog a fresh environment, so this is the only
# way to configure them):
#   HPC_JOB_MAPPING_DIR  the --hpc-job-mapping-dir of dcgm-exporter (default /run/dcgm-hpc-jobs); %n is replaced
#                        by the node name (hosts running several slurmd)
#   NODE_GPUS            GPU indices used when the job has no GPU gres (SLURM_JOB_GPUS unset): "0-7" or "0,1,2,3";
#                        default: every GPU nvidia-smi lists
#   LOG_FILE             a file to append log lines to (also sent to syslog as nightshift-hpc-job-mapping)
#
# It never fails the job: every problem is logged and the script exits 0. Writes are atomic (a temporary file
# renamed over the old one) under an flock on the directory's .lock, so concurrent jobs sharing a GPU keep each
# other's lines.

# Defaults, then the environment (slurmd passes none of these: it is for running the script by hand or from the
# simulator), then the .conf file.
HPC_JOB_MAPPING_DIR="${HPC_JOB_MAPPING_DIR:-/run/dcgm-hpc-jobs}"
NODE_GPUS="${NODE_GPUS:-}"
LOG_FILE="${LOG_FILE:-}"
conf="${0%.sh}.conf"
# shellcheck source=/dev/null
[ -r "$conf" ] && . "$conf"

log() {
    line="nightshift-hpc-job-mapping: job ${SLURM_JOB_ID:-?} on ${SLURMD_NODENAME:-?}: $*"
    printf '%s\n' "$line" >&2
    command -v logger >/dev/null 2>&1 && logger -t nightshift-hpc-job-mapping -- "$line" 2>/dev/null
    [ -n "$LOG_FILE" ] && printf '%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$line" >>"$LOG_FILE" 2>/dev/null
    return 0
}

mode="${1:-${SLURM_SCRIPT_CONTEXT:-}}"
case "$mode" in
    prolog | prolog_slurmd) mode=prolog ;;
    epilog | epilog_slurmd) mode=epilog ;;
    *) log "unknown mode '$mode' (expected prolog or epilog)"; exit 0 ;;
esac
job="${SLURM_JOB_ID:-}"
case "$job" in
    '' | *[!0-9]*) log "SLURM_JOB_ID '$job' is not a job id; nothing mapped"; exit 0 ;;
esac
dir=$(printf '%s' "$HPC_JOB_MAPPING_DIR" | sed "s/%n/${SLURMD_NODENAME:-}/g")

# "0-3,6" -> "0 1 2 3 6"; anything but digits, commas and dashes yields nothing.
expand() {
    case "$1" in *[!0-9,-]*) return 0 ;; esac
    printf '%s\n' "$1" | tr ',' '\n' | while IFS=- read -r low high; do
        [ -n "$low" ] || continue
        seq "$low" "${high:-$low}" 2>/dev/null
    done
}

if [ -n "${SLURM_JOB_GPUS:-}" ]; then
    gpus=$(expand "$SLURM_JOB_GPUS")
elif [ -n "$NODE_GPUS" ]; then
    gpus=$(expand "$NODE_GPUS")
elif command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr -dc '0-9\n')
else
    gpus=
fi
if [ -z "$gpus" ]; then
    log "no GPU indices (SLURM_JOB_GPUS, NODE_GPUS and nvidia-smi give none); nothing mapped"
    exit 0
fi

if ! mkdir -p "$dir" 2>/dev/null; then
    log "cannot create $dir; nothing mapped"
    exit 0
fi

# Rewrite $dir/$gpu without this job's line, adding it back in prolog mode; remove the file when it is empty.
update() {
    gpu=$1
    file="$dir/$gpu"
    tmp="$dir/.$gpu.$$"
    : >"$tmp" || return 1
    if [ -f "$file" ]; then
        grep -vx -- "$job" "$file" >>"$tmp"
        [ $? -le 1 ] || return 1 # 1: no other line
    fi
    if [ "$mode" = prolog ]; then
        printf '%s\n' "$job" >>"$tmp" || return 1
    fi
    if [ -s "$tmp" ]; then
        chmod 0644 "$tmp" && mv -f -- "$tmp" "$file"
    else
        rm -f -- "$tmp" "$file"
    fi
}

failed=
(
    command -v flock >/dev/null 2>&1 && flock -w 10 9
    for gpu in $gpus; do
        update "$gpu" || exit 1
    done
) 9>>"$dir/.lock" 2>/dev/null || failed=1
if [ -n "$failed" ]; then
    log "could not write the mapping in $dir (${mode}); the job runs without hpc_job labels"
    rm -f -- "$dir"/.*."$$" 2>/dev/null
fi
exit 0
