# The demo checks its own collectives against references on every rank; run it as an end-to-end test.
if(TARGET zero3)
  foreach(np 1 2 3 4)
    add_test(NAME mpi.demo.np${np}
             COMMAND ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS} -np ${np} $<TARGET_FILE:zero3> demo --params 100003 --device host)
    set_tests_properties(mpi.demo.np${np} PROPERTIES LABELS "mpi" TIMEOUT 120 PROCESSORS ${np})
  endforeach()
endif()
