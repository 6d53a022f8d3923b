# check.cmake: builds and runs tests/install_consumer against Kiln, in MODE "install" (cmake --install
# the build tree KILN_BUILD into WORK/prefix, then find_package) or "subdirectory" (add_subdirectory
# of KILN_SOURCE). Run by CTest as `cmake -DMODE=... -P check.cmake`; fails on any step's failure.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
if(MODE STREQUAL "install")
  step(${CMAKE_COMMAND} --install ${KILN_BUILD} --prefix ${WORK}/prefix)
  step(${CMAKE_COMMAND} -S ${KILN_SOURCE}/tests/install_consumer -B ${WORK}/build -G ${GENERATOR}
       -DCMAKE_PREFIX_PATH=${WORK}/prefix -DCMAKE_BUILD_TYPE=Release)
else()
  step(${CMAKE_COMMAND} -S ${KILN_SOURCE}/tests/install_consumer -B ${WORK}/build -G ${GENERATOR}
       -DKILN_VENDORED=${KILN_SOURCE} -DCMAKE_BUILD_TYPE=Release)
endif()
step(${CMAKE_COMMAND} --build ${WORK}/build)
step(${WORK}/build/consumer)
