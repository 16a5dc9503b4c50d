# The engine at world sizes 1-4 against the unsharded float64 reference (tests/model): params, loss curves,
# grad norms, lrs, loss scales, accumulation, overflow skips, memory budget, communication volume.
if(TARGET zero3_engine)
  zero3_mpi_test(engine_equivalence SOURCES mpi/test_engine_equivalence.cpp LIBS zero3_test_support zero3_test_model
                 zero3_train zero3_engine NP 1 2 3 4)
endif()

# 16-bit optimizer storage (bf16/fp16 master weights, bf16 moments) at world sizes 1 and 2, on the device and
# with CPU and NVMe offload: each stored value the fp32 step rounded once (bitwise), NVMe == CPU offload ==
# device bitwise, and the float64 reference that rounds its master and moments after every update.
if(TARGET zero3_engine)
  zero3_mpi_test(optimizer_storage SOURCES mpi/test_optimizer_storage.cpp LIBS zero3_test_support zero3_test_model
                 zero3_train zero3_engine NP 1 2)
endif()

# `zero3-bench engine` (tools/bench/cmd_bench_engine.cpp) must run as a plain single process, without mpirun.
if(TARGET zero3-bench)
  add_test(NAME unit.bench_engine
           COMMAND $<TARGET_FILE:zero3-bench> engine --json --repeats 1 --steps 2 --d-model 32 --layers 2)
  set_tests_properties(unit.bench_engine PROPERTIES LABELS "unit" TIMEOUT 120
                       PASS_REGULAR_EXPRESSION "\"overhead_ratio\"")
endif()
