# ZeRO-3 engine mechanics at world sizes 1-4 (3 gives uneven splits and padding): init, API errors,
# gather/prefetch/release, trace rebuilds, communication volume, gradient accumulation, fp16 overflow.
# One program, a file per topic (tests/mpi/engine_api/).
zero3_mpi_test(engine_api
               SOURCES mpi/engine_api/api_fixtures.cpp mpi/engine_api/init.cpp mpi/engine_api/errors.cpp
                       mpi/engine_api/gathers.cpp mpi/engine_api/grads.cpp mpi/engine_api/step.cpp
               LIBS zero3_test_support zero3_engine NP 1 2 3 4)
# Non-finite steps (fp32, bf16; on the device and offloaded), the skip/abort policy and its event, a rank's
# non-finite loss, discarded windows, reset_moments and the lr factor (tests/mpi/test_nonfinite.cpp).
zero3_mpi_test(nonfinite SOURCES mpi/test_nonfinite.cpp LIBS zero3_test_support zero3_engine NP 1 2 3)
