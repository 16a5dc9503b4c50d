# The engine and offload tests (tests/mpi/engine.tests.cmake, offload.tests.cmake) on a CUDA device: the same programs under mpirun -np 1
# with ZERO3_TEST_DEVICE=cuda. Without a usable CUDA device they exit 77 before starting MPI
# (tests/support/mpi_main.cpp), which ctest reports as skipped.
if(TARGET zero3_engine)
  foreach(name engine_equivalence engine_api offload_equivalence optimizer_storage nonfinite)
    add_test(NAME gpu.${name}.np1 COMMAND ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS} -np 1 $<TARGET_FILE:test_${name}>)
    set_tests_properties(gpu.${name}.np1 PROPERTIES LABELS "gpu" ENVIRONMENT "ZERO3_TEST_DEVICE=cuda" TIMEOUT 300)
  endforeach()
endif()
