# CLI tests run the real magiattn binary: small end-to-end runs that must PASS against the
# oracle, the mask printer and a save/load round trip, and bad input that must fail with
# exit code 2 and a readable message naming the culprit: no source location (that is for
# --verbose), no 309-digit range, one line under mpirun however many ranks fail.
set(cli_no_location "failed at src/|\\(at src/|check `")

# magi_cli_expect(name exe exit_code regex not_regex args...): `exe args` must exit with
# exit_code, print something matching regex and nothing matching not_regex ("" for none).
function(magi_cli_expect name exe exit_code regex not_regex)
  string(REPLACE ";" "|" args "${ARGN}")
  add_test(NAME cli.${name}
           COMMAND ${CMAKE_COMMAND} -DEXE=${exe} "-DARGS=${args}" -DEXIT=${exit_code}
                   "-DREGEX=${regex}" "-DNOT_REGEX=${not_regex}"
                   -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake)
endfunction()
function(magi_cli_test name exit_code regex)
  magi_cli_expect(${name} $<TARGET_FILE:magiattn> ${exit_code} "${regex}" "${cli_no_location}"
                  ${ARGN})
endfunction()

set(mask_json ${CMAKE_CURRENT_BINARY_DIR}/cli_block_sparse.json)
set(missing_json ${CMAKE_CURRENT_BINARY_DIR}/does-not-exist.json)
set(broken_json ${CMAKE_CURRENT_BINARY_DIR}/cli_broken_mask.json)
file(WRITE ${broken_json} "{\"total_seqlen_q\": 4}\n")

magi_cli_test(version 0 "magiattn 0\\.1\\.0" --version)
magi_cli_test(run_default_small 0 "result +PASS" run --seqlen 2048)
magi_cli_test(run_fp64_gqa 0 "result +PASS" run --seqlen 1024 --dtype fp64 --heads-q 4
              --heads-kv 1 --head-dim 64 --mask causal)
magi_cli_test(run_bf16_window 0 "result +PASS" run --seqlen 2048 --dtype bf16 --mask
              sliding-window --window 256 --head-dim 64)
magi_cli_test(run_softcap_sink_json 0 "\"pass\":true" run --seqlen 1024 --mask shared-question
              --softcap 30 --sink 2 --head-dim 64 --json)
magi_cli_test(mask_print 0 "slices +[0-9]+.*area.*#" mask --mask varlen-block-causal --seqlen
              8192 --block 512)
magi_cli_test(mask_save 0 "saved" mask --mask block-sparse --seqlen 1024 --save ${mask_json})
magi_cli_test(run_mask_file 0 "mask +file .*result +PASS" run --mask-file ${mask_json}
              --head-dim 64)
set_tests_properties(cli.mask_save PROPERTIES FIXTURES_SETUP cli_mask_json)
set_tests_properties(cli.run_mask_file PROPERTIES FIXTURES_REQUIRED cli_mask_json)

magi_cli_test(bad_flag 2 "magiattn: error: .*--bogus" run --bogus)
magi_cli_test(no_subcommand 2 "magiattn: error: .*subcommand")
magi_cli_test(unknown_family 2 "magiattn: error: unknown mask family 'nope' \\(valid: full, causal"
              run --mask nope)
magi_cli_test(missing_mask_file 2
              "magiattn: error: cannot open mask file '.*does-not-exist\\.json'\n" mask
              --mask-file ${missing_json})
magi_cli_test(bad_dtype 2 "magiattn: error: .*int8" run --dtype int8)
magi_cli_test(bad_seqlen 2 "magiattn: error: --seqlen: must be >= 1 \\(got -5\\)" run --seqlen -5)
magi_cli_test(bad_heads 2 "magiattn: error: --heads-q 6 is not a multiple of --heads-kv 4\n" run
              --seqlen 256 --heads-q 6 --heads-kv 4)
magi_cli_test(mask_and_file_conflict 2 "magiattn: error: .*excludes" run --mask causal --mask-file
              x.json)

# Out-of-range values name the bound, not CLI11's whole double range (309 digits).
magi_cli_expect(seqlen_zero $<TARGET_FILE:magiattn> 2
                "magiattn: error: --seqlen: must be >= 1 \\(got 0\\)" "1797693|0\\.000000" run
                --seqlen 0)
magi_cli_expect(plan_cp_zero $<TARGET_FILE:magiattn> 2
                "magiattn: error: --cp: must be >= 1 \\(got 0\\)" "1797693|0\\.000000" plan --cp 0)
magi_cli_test(head_dim_not_multiple 2
              "magiattn: error: --head-dim: must be a multiple of 8 \\(got 12\\)" run --head-dim 12)
magi_cli_test(head_dim_too_large 2
              "magiattn: error: --head-dim: must be in \\[8, 256\\] \\(got 512\\)" run --head-dim
              512)
magi_cli_test(density_zero 2 "magiattn: error: --density: must be in \\(0, 1\\] \\(got 0\\)"
              mask --mask block-sparse --density 0)
magi_cli_test(seqlen_over_area_limit 2
              "magiattn: error: --seqlen 4,000,000,000: at most 2,147,483,648 tokens" mask --mask
              causal --seqlen 4000000000)

set(huge_json ${CMAKE_CURRENT_BINARY_DIR}/cli_huge_mask.json)
file(WRITE ${huge_json} "{\"total_seqlen_q\": 1000000000000, \"total_seqlen_k\": 1000000000000, "
                        "\"q_ranges\": [[0, 1000000000000]], \"k_ranges\": [[0, 1000000000000]], "
                        "\"attn_type_map\": [0]}\n")
magi_cli_test(mask_file_over_area_limit 2
              "huge_mask\\.json: total_seqlen_q x total_seqlen_k = 10+ x 10+ cells: more than"
              run --mask-file ${huge_json})

# A mask file fixes the mask and its tokens: the family flags conflict with it (at parse time,
# before the file is read).
string(CONCAT conflict_re "magiattn: error: --(seqlen excludes --mask-file|mask-file excludes "
              "--seqlen) \\(give one or the other\\)")
magi_cli_test(mask_file_and_seqlen 2 "${conflict_re}" run --mask-file ${mask_json} --seqlen 4096)
magi_cli_test(mask_file_and_window 2 "magiattn: error: .*excludes --(window|mask-file)" mask
              --window 64 --mask-file ${mask_json})

# Memory is estimated before anything is allocated: 10^12 tokens used to fill memory for 54 s
# and die of std::bad_alloc (exit 3); now a refusal within the second, with the estimate.
string(CONCAT memory_re "magiattn: error: run needs about [0-9.]+ PiB of memory "
              "\\(inputs [0-9.]+ PiB, .*\\) but [0-9.]+ [KMGT]?i?B is available")
magi_cli_test(run_memory_refused 2 "${memory_re}" run --seqlen 1000000000000)
magi_cli_test(run_memory_refused_heads 2 "magiattn: error: run needs about [0-9.]+ TiB" run
              --seqlen 1000 --heads-q 100000000 --heads-kv 1)
magi_cli_test(mask_memory_refused 2 "magiattn: error: the mask needs about [0-9.]+ EiB" mask
              --mask block-sparse --seqlen 1000000000000)
set_tests_properties(cli.run_memory_refused cli.run_memory_refused_heads cli.mask_memory_refused
                     PROPERTIES TIMEOUT 10)

# Errors carry the message only; --verbose (before or after the subcommand) adds where the
# library raised it. A message re-wrapped by the library (path: inner message) is cut too.
magi_cli_test(broken_mask_file 2
              "cli_broken_mask\\.json: mask JSON: missing field \"total_seqlen_k\"\n" mask
              --mask-file ${broken_json})
set(location_re
    "cannot open mask file '.*' \\(check `in.good\\(\\)` failed at src/mask/json\\.cc:[0-9]+\\)")
magi_cli_expect(verbose_location $<TARGET_FILE:magiattn> 2 "${location_re}" "" --verbose mask
                --mask-file ${missing_json})
magi_cli_expect(verbose_after_subcommand $<TARGET_FILE:magiattn> 2 "${location_re}" "" mask
                --mask-file ${missing_json} --verbose)

# `magiattn plan`: a small varlen-causal plan over 8 ranks, saved as JSON: binary units in
# aligned columns, one imbalance figure. Bad input names the flag, and the divisibility hint
# names a flag that exists (the library's own says "set uneven").
set(plan_json ${CMAKE_CURRENT_BINARY_DIR}/cli_plan.json)
string(CONCAT plan_re "plan +cp 8, chunks of [0-9,]+ tokens.*\n"
              "imbalance +[0-9]+\\.[0-9][0-9]% \\(max / mean - 1 of the ranks' visible area.*\n"
              "rank +tokens +area +host area +K/V in +K/V out\n"
              " +0 +1,024 .* [KMG]iB +[0-9.]+ [KMG]iB\n"
              ".*K/V bytes +ours [0-9.]+ MiB, ring \\(zigzag\\) [0-9.]+ MiB, all-gather.*saved")
magi_cli_test(plan_small 0 "${plan_re}" plan --seqlen 8192 --cp 8 --json ${plan_json})
# No raw byte counts (7 digits or more without separators) and no second imbalance.
magi_cli_expect(plan_one_imbalance $<TARGET_FILE:magiattn> 0 "imbalance"
                "imbalance.*imbalance|[0-9][0-9][0-9][0-9][0-9][0-9][0-9]" plan --seqlen 8192
                --cp 8)
magi_cli_test(plan_stages_columns 0 "stage 0 in +stage 1 in\n +0 .*MiB +[0-9.]+ MiB +[0-9.]+ MiB\n"
              plan --seqlen 8192 --cp 4 --stages 2 --mask causal)
magi_cli_test(plan_bad_algorithm 2 "magiattn: error: --algorithm 'lpt'" plan --seqlen 1024 --cp 2
              --algorithm lpt)
magi_cli_test(plan_indivisible 2
              "magiattn: error: --seqlen 1,000: not divisible by --cp 3 \\(pass --uneven to allow"
              plan --seqlen 1000 --cp 3)
magi_cli_test(plan_indivisible_chunk 2
              "by --cp 3 x --chunk-size 128 \\(pass --uneven to allow a short last chunk\\)" plan
              --seqlen 1024 --cp 3 --chunk-size 128)
magi_cli_test(plan_uneven 0 "plan +cp 3" plan --seqlen 1000 --cp 3 --uneven)
magi_cli_test(plan_too_few_tokens 2
              "magiattn: error: --seqlen 1,000: fewer tokens than --cp 2000 \\(every rank needs"
              plan --seqlen 1000 --cp 2000 --uneven)

# `mpirun -np N magiattn run`: the distributed run through the runtime, checked on rank 0.
if(TARGET magi_runtime AND TARGET magi_comm_mpi)
  find_package(MPI COMPONENTS CXX)
  set(cli_mpi_flags --oversubscribe --allow-run-as-root ${MPIEXEC_PREFLAGS})
  foreach(np 2 4)
    add_test(NAME cli.run_mpi_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${cli_mpi_flags} ${MPIEXEC_NUMPROC_FLAG} ${np}
                     $<TARGET_FILE:magiattn> run --seqlen 2048)
    set_tests_properties(cli.run_mpi_np${np} PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION
                         "result +PASS" FAIL_REGULAR_EXPRESSION
                         "result +FAIL;magiattn: (internal )?error"
                         ENVIRONMENT "${MAGI_MPI_TEST_ENV}" PROCESSORS 2)
  endforeach()
  # --ranks without mpirun: magiattn starts the ranks itself.
  add_test(NAME cli.run_ranks_self_launch COMMAND magiattn run --ranks 2 --seqlen 1024 --threads 1)
  set_tests_properties(cli.run_ranks_self_launch PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION
                       "ranks +2 \\(MPI.*result +PASS" FAIL_REGULAR_EXPRESSION
                       "result +FAIL;magiattn: (internal )?error" PROCESSORS 2
                       ENVIRONMENT "${MAGI_MPI_TEST_ENV}")
  # --ranks refuses what every rank would refuse before starting any: memory for both ranks
  # of this host, tokens the ranks do not divide (the hint names run's own --uneven).
  magi_cli_test(ranks_memory_refused 2
                "run needs about [0-9.]+ PiB of memory \\(2 ranks on this host x" run --ranks 2
                --seqlen 1000000000000)
  magi_cli_test(ranks_indivisible 2
                "magiattn: error: --seqlen 1,000: not divisible by --ranks 3 \\(pass --uneven"
                run --ranks 3 --seqlen 1000)
  # Under mpirun, one error line however many ranks fail: the same flags fail alike (rank 0
  # prints), a setup failure is compared across ranks, a failure of one rank is printed by it.
  set(cli_once "magiattn: (internal )?error.*magiattn: (internal )?error|${cli_no_location}")
  magi_cli_expect(mpi_bad_flag_once ${MPIEXEC_EXECUTABLE} 2
                  "magiattn: error: --seqlen: must be >= 1" "${cli_once}" ${cli_mpi_flags}
                  ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:magiattn> run --seqlen 0)
  magi_cli_expect(mpi_setup_error_once ${MPIEXEC_EXECUTABLE} 2
                  "magiattn: error: cannot open mask file" "${cli_once}|rank 1:" ${cli_mpi_flags}
                  ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:magiattn> run --mask-file ${missing_json})
  magi_cli_expect(mpi_indivisible_once ${MPIEXEC_EXECUTABLE} 2
                  "--seqlen 1,000: not divisible by 3 MPI ranks \\(pass --uneven" "${cli_once}"
                  ${cli_mpi_flags} ${MPIEXEC_NUMPROC_FLAG} 3 $<TARGET_FILE:magiattn> run --seqlen
                  1000 --threads 1)
  magi_cli_expect(mpi_one_rank_fails ${MPIEXEC_EXECUTABLE} 2
                  "magiattn: error: rank 1: cannot open mask file" "${cli_once}" ${cli_mpi_flags}
                  ${MPIEXEC_NUMPROC_FLAG} 2 ${CMAKE_CURRENT_LIST_DIR}/one_rank_fails.sh
                  $<TARGET_FILE:magiattn> ${missing_json})
  magi_cli_expect(mpi_uneven ${MPIEXEC_EXECUTABLE} 0 "ranks +3 \\(MPI.*result +PASS" ""
                  ${cli_mpi_flags} ${MPIEXEC_NUMPROC_FLAG} 3 $<TARGET_FILE:magiattn> run --seqlen
                  1000 --uneven --threads 1 --check-rows 16)
  set_tests_properties(cli.mpi_bad_flag_once cli.mpi_setup_error_once cli.mpi_indivisible_once
                       cli.mpi_one_rank_fails cli.mpi_uneven PROPERTIES TIMEOUT 60 PROCESSORS 2
                       ENVIRONMENT "${MAGI_MPI_TEST_ENV}")
endif()

# --device and --comm (apps/magiattn/device_run.h). These run everywhere: a CPU run with 16-bit
# inputs, and --comm nccl on the cpu refused naming both flags.
magi_cli_test(run_device_cpu_bf16 0 "problem .* bf16, cpu, .*result +PASS" run --device cpu
              --dtype bf16 --seqlen 1024 --head-dim 64)
string(CONCAT nccl_cpu_re "magiattn: error: --comm nccl: NCCL moves GPU rows, but this run "
              "is on the cpu \\(--device cpu\\)")
magi_cli_test(comm_nccl_on_cpu 2 "${nccl_cpu_re}" run --device cpu --comm nccl --seqlen 256)
magi_cli_test(bad_device 2 "magiattn: error: .*--device.*tpu" run --device tpu)
if(NOT MAGI_ENABLE_CUDA)
  # A build without the GPU kernels (CI): auto is the cpu, and cuda says why it cannot be.
  # Only here, where the answer does not depend on the machine having a GPU.
  magi_cli_test(device_cuda_without_kernels 2
                "magiattn: error: --device cuda: this build of magiattn has no GPU kernels" run
                --device cuda --seqlen 256)
  magi_cli_test(device_auto_is_cpu 0 "problem .* fp32, cpu, .*result +PASS" run --seqlen 1024
                --head-dim 64)
else()
  # GPU runs (label gpu, as tests/gpu): skipped where `--device cuda` finds no usable GPU,
  # which it reports before allocating anything.
  set(cli_no_gpu "--device cuda: (no CUDA device is visible|cuda:0 .* is sm_|no kernel for)")
  # magi_cli_gpu_test(name pass_regex args...): `magiattn args` under CTest's regexes.
  function(magi_cli_gpu_test name pass_regex)
    add_test(NAME cli.${name} COMMAND magiattn ${ARGN})
    set_tests_properties(cli.${name} PROPERTIES LABELS gpu TIMEOUT 600
                         PASS_REGULAR_EXPRESSION "${pass_regex}"
                         FAIL_REGULAR_EXPRESSION "result +FAIL;internal error"
                         SKIP_REGULAR_EXPRESSION "${cli_no_gpu};cannot load libnccl")
  endfunction()
  magi_cli_gpu_test(gpu_run "problem .* bf16, cuda:[0-9]+ .*result +PASS" run --device cuda
                    --seqlen 4096)
  magi_cli_gpu_test(gpu_run_fp16_json "\"device\":\"cuda:[0-9]+ .*\"pass\":true" run --device
                    cuda --dtype fp16 --seqlen 2048 --json)
  if(TARGET magi_runtime AND TARGET magi_comm_mpi)
    # Two and three ranks on one GPU over MPI (device rows staged through the host): the
    # sizes at which rank 0's remote stage has query tiles without keys (these hung until the
    # forward stopped loading Q for them, 2026-12-02).
    magi_cli_gpu_test(gpu_run_ranks2_mpi
                      "ranks +2 \\(MPI staging GPU rows through the host.*result +PASS" run
                      --ranks 2 --device cuda --comm mpi --seqlen 8192 --mask causal)
    magi_cli_gpu_test(gpu_run_ranks3_mpi_varlen
                      "ranks +3 \\(MPI staging GPU rows through the host.*result +PASS" run
                      --ranks 3 --device cuda --comm mpi --seqlen 12288 --mask varlen-causal)
    set_tests_properties(cli.gpu_run_ranks2_mpi cli.gpu_run_ranks3_mpi_varlen PROPERTIES
                         PROCESSORS 2 TIMEOUT 300
                         ENVIRONMENT "${MAGI_MPI_TEST_ENV};CUDA_VISIBLE_DEVICES=0")
  endif()
  if(TARGET magi_comm_nccl AND TARGET magi_runtime AND TARGET magi_comm_mpi)
    magi_cli_gpu_test(gpu_run_nccl_np1 "ranks +1 \\(NCCL.*result +PASS" run --ranks 1 --device
                      cuda --comm nccl --seqlen 4096)
    # Two ranks on one visible GPU: refused before any rank starts or NCCL is called.
    magi_cli_gpu_test(gpu_nccl_two_ranks_one_gpu
                      "magiattn: error: --comm nccl: NCCL needs one GPU per rank: 2 ranks, 1 GPUs"
                      run --ranks 2 --device cuda --comm nccl --seqlen 4096)
    set_tests_properties(cli.gpu_run_nccl_np1 cli.gpu_nccl_two_ranks_one_gpu PROPERTIES
                         ENVIRONMENT "${MAGI_MPI_TEST_ENV};CUDA_VISIBLE_DEVICES=0")
  endif()
endif()
