# ZeRO-3 engine mechanics at world sizes 1-4 (3 gives uneven splits and padding): init, API errors,
# gather/prefetch/release, trace rebuilds, communication volume, gradient accumulation, fp16 overflow.
zero3_mpi_test(engine_api SOURCES mpi/test_engine_api.cpp LIBS zero3_engine NP 1 2 3 4)
