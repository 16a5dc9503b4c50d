# The host backend's scope-memory guard (ZERO3_GUARD_SCOPE_MEMORY=1) on a one-unit engine at 1 and 2 ranks
# (tests/mpi/scope_guard_test.sh): host-thread access to GatherScope/GradScope memory aborts with the fix,
# training through launch_host gives the same numbers with and without it. Not under sanitizers: their
# runtimes own SIGSEGV.
add_executable(scope_guard_probe ${CMAKE_CURRENT_LIST_DIR}/scope_guard_probe.cpp)
target_link_libraries(scope_guard_probe PRIVATE zero3_engine)
zero3_project_flags(scope_guard_probe)
if(NOT ZERO3_SANITIZE)
  add_test(NAME mpi.device_scope_guard
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/scope_guard_test.sh $<TARGET_FILE:scope_guard_probe> ${ZERO3_MPIEXEC}
                   ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.device_scope_guard PROPERTIES LABELS "mpi" TIMEOUT 300 PROCESSORS 2)
endif()
