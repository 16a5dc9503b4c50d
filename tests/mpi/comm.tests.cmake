# MPI communicator tests at world sizes 1-4 (3 catches uneven splits and padding). ZERO3_MPIEXEC_FLAGS
# sets mpi_yield_when_idle: a rank blocked in MPI polls, and must yield to the rank it waits for.
zero3_mpi_test(comm_mpi SOURCES mpi/test_comm_mpi.cpp NP 1 2 3 4)
