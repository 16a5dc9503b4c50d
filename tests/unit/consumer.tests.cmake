# The installed package as a C++ trainer sees it: `cmake --install` into a fresh prefix, then tests/consumer
# (find_package(zero3) + zero3::runtime) configured, built and run against that prefix.
add_test(NAME unit.consumer_find_package
         COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/../consumer/run_consumer_test.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
set_tests_properties(unit.consumer_find_package PROPERTIES LABELS "unit" TIMEOUT 300)
