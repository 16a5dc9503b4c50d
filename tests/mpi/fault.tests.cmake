# Fault injection through `zero3 train` (tests/mpi/fault_test.sh): a stopped rank, an MPI error, a skipped
# gather, an extra micro-batch and a one-rank collective each end the job non-zero within timeout + 30 s
# with a report and flight records naming the op, unit, step and rank; twice each. Label "fault"; not
# under sanitizers (their slowdown is not what the deadlines are about).
if(TARGET zero3 AND NOT ZERO3_SANITIZE)
  add_test(NAME mpi.fault
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/fault_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.fault PROPERTIES LABELS "mpi;fault" TIMEOUT 400)
endif()

# Two jobs on one ZERO3_PROGRESS_PORT (tests/mpi/progress_port_test.sh): the second ends on every rank with
# an error naming the port, instead of hanging.
if(TARGET zero3)
  add_test(NAME mpi.progress_port
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/progress_port_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.progress_port PROPERTIES LABELS "mpi;fault" TIMEOUT 300)
endif()
