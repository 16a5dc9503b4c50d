# NUMA placement (synthetic and hand-written XML topologies with GPUs on two nodes, plus this machine) and the
# pinned-memory budget checks over made-up host memory facts.
# test_numa has its own main: the memory-binding test case, which this machine may be unable to check
# (exit 77: Skipped), runs on its own as unit.offload_numa.membind.
add_executable(test_offload_numa ${CMAKE_CURRENT_LIST_DIR}/test_numa.cpp)
target_link_libraries(test_offload_numa PRIVATE Catch2::Catch2 zero3_offload zero3::hwloc)
target_include_directories(test_offload_numa PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support)
zero3_project_flags(test_offload_numa)
add_test(NAME unit.offload_numa COMMAND test_offload_numa "~[membind]")
set_tests_properties(unit.offload_numa PROPERTIES LABELS "unit" TIMEOUT 300)
add_test(NAME unit.offload_numa.membind COMMAND test_offload_numa "[membind]")
set_tests_properties(unit.offload_numa.membind PROPERTIES LABELS "unit" TIMEOUT 300)
zero3_unit_test(offload_pinned_budget SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pinned_budget.cpp LIBS zero3_offload)
