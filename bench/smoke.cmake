# SPDX-License-Identifier: MIT
# Runs `tollgate_bench --quick` (BENCH is its path) and fails unless it exits
# 0 and prints result lines. Timing is never checked: CI machines are noisy.
execute_process(COMMAND ${BENCH} --quick RESULT_VARIABLE rc
  OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tollgate_bench --quick exited with ${rc}")
endif()
string(REGEX MATCHALL "\nname=[a-z_0-9]+ " lines "\n${out}")
list(LENGTH lines n)
if(n LESS 20)
  message(FATAL_ERROR "tollgate_bench --quick printed ${n} result lines")
endif()
