#!/bin/sh
# tests/distributed/srun_check.sh N PROGRAM: runs PROGRAM as N tasks of one srun step on one node,
# through PMIx (`srun --mpi=pmix`, as a user would), more tasks than cores allowed (--overcommit).
# Exits 77 (CTest's "skipped") where no Slurm controller answers within 10 s (most machines, CI
# included) or Slurm has no PMIx plugin; gives up after 60 s when the cluster has no room.
n=$1
program=$2
skip() {
  echo "srun_check: $1; skipped"
  exit 77
}
command -v srun >/dev/null 2>&1 || skip "no srun here"
timeout 10 sinfo --noheader >/dev/null 2>&1 || skip "no Slurm controller answers"
srun --mpi=list 2>&1 | grep -q pmix || skip "this Slurm has no PMIx plugin"
exec timeout 500 srun --ntasks="$n" --nodes=1 --overcommit --immediate=60 --mpi=pmix --kill-on-bad-exit=1 "$program"
