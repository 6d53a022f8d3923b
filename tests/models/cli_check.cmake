# tests/models/cli_check.cmake: runs a program and checks how it failed: its exit code must be
# EXPECT_RC, and stderr exactly one line that matches EXPECT_ERR (a regular expression).
#   cmake -DPROGRAM=... -DARGS="a;b" -DEXPECT_RC=2 -DEXPECT_ERR="..." -P cli_check.cmake
execute_process(COMMAND ${PROGRAM} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL EXPECT_RC)
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT_RC}\nstdout: ${out}\nstderr: ${err}")
endif()
string(STRIP "${err}" err_stripped)
string(FIND "${err_stripped}" "\n" newline)
if(NOT newline EQUAL -1)
  message(FATAL_ERROR "stderr has more than one line:\n${err}")
endif()
if(NOT err_stripped MATCHES "${EXPECT_ERR}")
  message(FATAL_ERROR "stderr does not match '${EXPECT_ERR}':\n${err}")
endif()
