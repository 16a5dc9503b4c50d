# NUMA placement (synthetic and hand-written XML topologies with GPUs on two nodes, plus this machine) and the
# pinned-memory budget checks over made-up host memory facts.
zero3_unit_test(offload_numa SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_numa.cpp LIBS zero3_offload zero3::hwloc)
zero3_unit_test(offload_pinned_budget SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pinned_budget.cpp LIBS zero3_offload)
