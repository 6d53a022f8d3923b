# tests/models/train_check.cmake: what the training programs' check scripts share (include() it):
# running the program, a small corpus, and reading and comparing the losses of a metrics.jsonl.

# Runs PROGRAM (under `launcher`, a list; "" for none) with ARGN; its stdout goes to out_var. A
# failure stops the script with the program's output.
function(run_program out_var launcher)
  execute_process(COMMAND ${launcher} ${PROGRAM} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    get_filename_component(name ${PROGRAM} NAME)
    message(FATAL_ERROR "${name} ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()

# 40 lines of pangrams: a corpus small enough for a test, long enough for its validation tenth.
function(write_test_corpus path)
  set(text "")
  foreach(i RANGE 1 40)
    string(APPEND text "Line ${i}: the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs.\n")
  endforeach()
  file(WRITE ${path} "${text}")
endfunction()

# A non-negative number as JSON writes it ("2.2078452527523043", "5.08e-05") in units of 1e-9.
function(nano out_var text)
  if(text MATCHES "^([0-9]+)[.]?([0-9]*)e-([0-9]+)$")
    set(int "${CMAKE_MATCH_1}")
    set(frac "${CMAKE_MATCH_2}")
    math(EXPR shift "${CMAKE_MATCH_3}")
    if(shift GREATER 9)
      set(${out_var} 0 PARENT_SCOPE)
      return()
    endif()
    string(REPEAT "0" ${shift} zeros)
    string(SUBSTRING "${zeros}" 1 -1 zeros)  # d.ddd e-k = 0.(k-1 zeros)dddd
    set(frac "${zeros}${int}${frac}")
    set(int 0)
  elseif(text MATCHES "^([0-9]+)[.]?([0-9]*)$")
    set(int "${CMAKE_MATCH_1}")
    set(frac "${CMAKE_MATCH_2}")
  else()
    message(FATAL_ERROR "not a number: '${text}'")
  endif()
  string(APPEND frac "000000000")
  string(SUBSTRING "${frac}" 0 9 frac)
  string(REGEX REPLACE "^0+([0-9])" "\\1" frac "${frac}")
  math(EXPR value "${int} * 1000000000 + ${frac}")
  set(${out_var} ${value} PARENT_SCOPE)
endfunction()

# The values of the keys that `key_regex` matches (alternatives, no group of its own) in the lines
# of a metrics file, in order.
function(metric_values out_var file key_regex)
  file(STRINGS ${file} lines)
  set(values "")
  foreach(line IN LISTS lines)
    if(line MATCHES "\"(${key_regex})\":([0-9.e-]+)")
      list(APPEND values "${CMAKE_MATCH_2}")
    endif()
  endforeach()
  set(${out_var} "${values}" PARENT_SCOPE)
endfunction()

# The "loss" of each step line and the "test_loss" of each epoch line of a metrics file, in order.
function(losses out_var file)
  metric_values(values ${file} "test_loss|loss")
  set(${out_var} "${values}" PARENT_SCOPE)
endfunction()

# The losses of two runs that do the same arithmetic in another order: as many, and each within
# 1e-5 relative (1e-8 absolute for those near 0).
function(check_losses_close a b a_name b_name)
  list(LENGTH a n)
  list(LENGTH b n_b)
  if(NOT n EQUAL n_b OR n EQUAL 0)
    message(FATAL_ERROR "${a_name} ${n} losses, ${b_name} ${n_b}")
  endif()
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    list(GET a ${i} x_text)
    list(GET b ${i} y_text)
    nano(x ${x_text})
    nano(y ${y_text})
    math(EXPR diff "${x} - ${y}")
    if(diff LESS 0)
      math(EXPR diff "0 - (${diff})")
    endif()
    math(EXPR bound "${y} / 100000 + 10")
    if(diff GREATER bound)
      message(FATAL_ERROR "loss ${i}: ${a_name} ${x_text}, ${b_name} ${y_text}")
    endif()
  endforeach()
endfunction()
