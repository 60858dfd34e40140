# Runs comm_mpi_fault under mpirun and passes iff every surviving rank printed its PASS line
# (mpirun itself exits non-zero: a rank died on purpose). Variables: MPIEXEC, NP, EXE, FLAGS.
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
execute_process(COMMAND ${MPIEXEC} ${flags} -np ${NP} ${EXE}
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 60)
message("${out}")
math(EXPR last "${NP} - 2")
foreach(r RANGE 0 ${last})
  if(NOT out MATCHES "fault-test rank ${r}: PASS")
    message(FATAL_ERROR "rank ${r} did not report the expected error (mpirun rc ${rc})\n${err}")
  endif()
endforeach()
