# `zero3 train` end to end (tests/mpi/train_cli_test.sh): the tiny GPT job reaches the entropy floor at
# world size 2 with CPU offload, curves are reproducible and world-size independent, bad input fails
# clearly. Not under sanitizers: it trains for a minute at full speed.
if(TARGET zero3 AND NOT ZERO3_SANITIZE)
  add_test(NAME mpi.train_cli
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train_cli_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.train_cli PROPERTIES LABELS "mpi" TIMEOUT 600)
endif()
# `zero3 train` on a job that diverges (tests/mpi/train_nonfinite_cli_test.sh): skipped non-finite steps,
# the stop after max_consecutive, policy abort; never a "done" line or exit 0 over a diverged run.
if(TARGET zero3)
  add_test(NAME mpi.train_nonfinite_cli
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train_nonfinite_cli_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.train_nonfinite_cli PROPERTIES LABELS "mpi" TIMEOUT 300)
endif()
