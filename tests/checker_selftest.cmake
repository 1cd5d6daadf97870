# What the checkers' self-tests share (tests/engine_purity, tests/layering):
# check() runs a checker script and says whether it did what it should.
# `failures` collects the names of the checks that did not.

# check(NAME EXPECT_OK WANT_TEXTS ARGS...): runs the checker with ARGS; the
# output must hold every one of WANT_TEXTS (a list).
function(check name expect_ok want)
  execute_process(COMMAND ${CMAKE_COMMAND} ${ARGN} -P ${CHECKER} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(expect_ok AND NOT rc EQUAL 0)
    set(problem "expected to pass, failed (${rc}):\n${out}")
  elseif(NOT expect_ok AND rc EQUAL 0)
    set(problem "expected to fail, passed:\n${out}")
  else()
    foreach(w IN LISTS want)
      string(FIND "${out}" "${w}" at)
      if(at EQUAL -1)
        set(problem "the output does not name '${w}':\n${out}")
      endif()
    endforeach()
  endif()
  if(DEFINED problem)
    message("FAIL ${name}: ${problem}")
    set(failures "${failures};${name}" PARENT_SCOPE)
  else()
    message("ok   ${name}")
  endif()
endfunction()
