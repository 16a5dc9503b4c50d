# The programs (tools/zero3, tools/bench) as a user meets them (tests/unit/programs_test.sh): the benchmarks
# are zero3-bench's subcommands and not zero3's, both print the version project() sets, and zero3-bench
# train refuses a zero3 program it cannot run.
if(TARGET zero3 AND TARGET zero3-bench)
  add_test(NAME unit.programs
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/programs_test.sh $<TARGET_FILE:zero3> $<TARGET_FILE:zero3-bench>
                   ${PROJECT_VERSION})
  set_tests_properties(unit.programs PROPERTIES LABELS "unit" TIMEOUT 120)
endif()
