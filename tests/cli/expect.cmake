# Runs one magiattn command and checks both its exit code and its output, which CTest's own
# properties cannot do together (PASS_REGULAR_EXPRESSION ignores the exit code).
# -DEXE=<binary> -DARGS=<args joined by |> -DEXIT=<code> -DREGEX=<regex on stdout+stderr>
# [-DNOT_REGEX=<regex the output must not match>] ('.' matches newlines too, so "error.*error"
# says "at most one error line").
string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND ${EXE} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(NOT rc STREQUAL EXIT)
  message(FATAL_ERROR "magiattn ${args}: exit code ${rc}, expected ${EXIT}")
endif()
if(NOT out MATCHES "${REGEX}")
  message(FATAL_ERROR "magiattn ${args}: output does not match '${REGEX}'")
endif()
if(DEFINED NOT_REGEX AND NOT NOT_REGEX STREQUAL "" AND out MATCHES "${NOT_REGEX}")
  message(FATAL_ERROR "magiattn ${args}: output matches '${NOT_REGEX}', which it must not")
endif()
