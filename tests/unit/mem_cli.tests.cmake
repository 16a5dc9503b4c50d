# `zero3 mem plan` and `zero3 mem fit` from the command line (tests/unit/mem_cli_test.sh): the plan's JSON
# shape, 1/N model states, what fits.
if(TARGET zero3)
  add_test(NAME unit.mem_cli COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/mem_cli_test.sh $<TARGET_FILE:zero3>
                                     ${CMAKE_CURRENT_LIST_DIR}/../../configs)
  set_tests_properties(unit.mem_cli PROPERTIES LABELS "unit" TIMEOUT 120)
endif()
