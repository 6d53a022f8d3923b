#!/bin/sh
# tests/distributed/srun_check.sh N PROGRAM: runs PROGRAM as N tasks of Slurm's srun, through PMIx
# (`srun --mpi=pmix`, as a user would), more tasks than cores allowed (--overcommit). Exits 77
# (CTest's "skipped") where no Slurm controller answers within 10 s, which is most machines.
n=$1
program=$2
if ! command -v srun >/dev/null 2>&1 || ! timeout 10 sinfo --noheader >/dev/null 2>&1; then
  echo "srun_check: no Slurm controller answers here; skipped"
  exit 77
fi
exec timeout 500 srun --ntasks="$n" --overcommit --mpi=pmix --kill-on-bad-exit=1 "$program"
