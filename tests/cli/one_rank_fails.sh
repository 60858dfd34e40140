#!/bin/sh
# Under mpiexec: rank 1 runs `magiattn run` on a missing mask file, the others a good run, so
# that only one rank fails its setup. Used by cli.mpi_one_rank_fails.
# Usage: one_rank_fails.sh <magiattn> <missing mask file>
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
if [ "$rank" = 1 ]; then
  exec "$1" run --mask-file "$2" --threads 1
fi
exec "$1" run --seqlen 1024 --threads 1 --check-rows 8
