# SPDX-License-Identifier: MIT
# labels.cmake - fails when a CTest test has no LABELS: `ctest -L unit` and
# the other label runs would then leave it out without a word. Run by the
# test_labels test as `cmake -DCTEST=... -DBUILD_DIR=... -P labels.cmake`; it
# reads the list CTest itself builds, so tests added in any directory count.
execute_process(COMMAND ${CTEST} --show-only=json-v1
                WORKING_DIRECTORY ${BUILD_DIR}
                OUTPUT_VARIABLE json RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ctest --show-only=json-v1 failed (${rc})")
endif()
string(JSON n LENGTH "${json}" tests)
if(n EQUAL 0)
  message(FATAL_ERROR "no tests listed")
endif()
set(missing "")
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  string(JSON name GET "${json}" tests ${i} name)
  string(JSON nprops ERROR_VARIABLE err LENGTH "${json}" tests ${i} properties)
  set(labelled FALSE)
  if(NOT err AND nprops GREATER 0)
    math(EXPR plast "${nprops} - 1")
    foreach(j RANGE ${plast})
      string(JSON pname GET "${json}" tests ${i} properties ${j} name)
      if(pname STREQUAL "LABELS")
        set(labelled TRUE)
      endif()
    endforeach()
  endif()
  if(NOT labelled)
    list(APPEND missing ${name})
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "tests without LABELS (set them beside add_test; the "
                      "labels are listed in docs/DESIGN.md, Tests): ${missing}")
endif()
message(STATUS "${n} tests, every one labelled")
