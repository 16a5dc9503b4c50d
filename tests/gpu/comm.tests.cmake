# The NCCL communicator, launched by mpirun like the mpi tests (one GPU per rank). Built in every build;
# without NCCL or a CUDA device the program exits 77 before starting MPI, which ctest reports as skipped.
add_executable(test_comm_nccl gpu/test_comm_nccl.cpp)
target_link_libraries(test_comm_nccl PRIVATE Catch2::Catch2 zero3_comm)
target_include_directories(test_comm_nccl PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support)
zero3_project_flags(test_comm_nccl)
add_test(NAME gpu.comm_nccl.np1
         COMMAND ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS} -np 1 $<TARGET_FILE:test_comm_nccl>)
set_tests_properties(gpu.comm_nccl.np1 PROPERTIES LABELS "gpu" TIMEOUT 300)
