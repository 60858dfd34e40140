# CLI tests run the real magiattn binary: small end-to-end runs that must PASS against the
# oracle, the mask printer and a save/load round trip, and bad input that must fail with
# exit code 2 and a message naming the culprit.
function(magi_cli_test name exit_code regex)
  string(REPLACE ";" "|" args "${ARGN}")
  add_test(NAME cli.${name}
           COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:magiattn> "-DARGS=${args}"
                   -DEXIT=${exit_code} "-DREGEX=${regex}" -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake)
endfunction()

set(mask_json ${CMAKE_CURRENT_BINARY_DIR}/cli_block_sparse.json)

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
magi_cli_test(missing_mask_file 2 "magiattn: error: .*does-not-exist\\.json" mask --mask-file
              ${CMAKE_CURRENT_BINARY_DIR}/does-not-exist.json)
magi_cli_test(bad_dtype 2 "magiattn: error: .*int8" run --dtype int8)
magi_cli_test(bad_seqlen 2 "magiattn: error: .*--seqlen" run --seqlen -5)
magi_cli_test(bad_heads 2 "magiattn: error: q: 6 heads are not a multiple of the 4" run
              --seqlen 256 --heads-q 6 --heads-kv 4)
magi_cli_test(mask_and_file_conflict 2 "magiattn: error: .*excludes" run --mask causal --mask-file
              x.json)

# `magiattn plan`: a small varlen-causal plan over 8 ranks, saved as JSON; bad input names the flag.
set(plan_json ${CMAKE_CURRENT_BINARY_DIR}/cli_plan.json)
magi_cli_test(plan_small 0 "imbalance.*planning time.*ours.*ring \\(zigzag\\).*all-gather.*saved"
              plan --seqlen 8192 --cp 8 --json ${plan_json})
magi_cli_test(plan_bad_algorithm 2 "magiattn: error: --algorithm 'lpt'" plan --seqlen 1024 --cp 2
              --algorithm lpt)
magi_cli_test(plan_indivisible 2 "magiattn: error: .*not divisible by cp 3" plan --seqlen 1000
              --cp 3)

# `mpirun -np N magiattn run`: the distributed run through the runtime, checked on rank 0.
if(TARGET magi_runtime AND TARGET magi_comm_mpi)
  find_package(MPI COMPONENTS CXX)
  set(cli_mpi_flags --oversubscribe --allow-run-as-root ${MPIEXEC_PREFLAGS})
  foreach(np 2 4)
    add_test(NAME cli.run_mpi_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${cli_mpi_flags} ${MPIEXEC_NUMPROC_FLAG} ${np}
                     $<TARGET_FILE:magiattn> run --seqlen 2048)
    set_tests_properties(cli.run_mpi_np${np} PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION
                         "result +PASS" FAIL_REGULAR_EXPRESSION "result +FAIL;magiattn: (internal )?error"
                         ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1" PROCESSORS 2)
  endforeach()
  # --ranks without mpirun: magiattn starts the ranks itself.
  add_test(NAME cli.run_ranks_self_launch COMMAND magiattn run --ranks 2 --seqlen 1024 --threads 1)
  set_tests_properties(cli.run_ranks_self_launch PROPERTIES TIMEOUT 120 PASS_REGULAR_EXPRESSION
                       "ranks +2 \\(MPI.*result +PASS" FAIL_REGULAR_EXPRESSION
                       "result +FAIL;magiattn: (internal )?error" PROCESSORS 2)
endif()
