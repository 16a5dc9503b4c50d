# `zero3 train` with model sizes past a 32-bit int or past any memory (tests/unit/int_cli_test.sh): each a config
# error naming the key and value, or the model that does not fit, within seconds.
if(TARGET zero3)
  add_test(NAME unit.int_cli COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/int_cli_test.sh $<TARGET_FILE:zero3>
                                     ${CMAKE_CURRENT_LIST_DIR}/../../configs)
  set_tests_properties(unit.int_cli PROPERTIES LABELS "unit" TIMEOUT 180)
endif()
