# The engine at world sizes 1-4 against the unsharded float64 reference (tests/model): params, loss curves,
# grad norms, lrs, loss scales, accumulation, overflow skips, memory budget, communication volume.
if(TARGET zero3_engine)
  zero3_mpi_test(engine_equivalence SOURCES mpi/test_engine_equivalence.cpp LIBS zero3_test_support zero3_test_model
                 zero3_train zero3_engine NP 1 2 3 4)
endif()

# `zero3-bench engine` (tools/bench/cmd_bench_engine.cpp) must run as a plain single process, without mpirun.
if(TARGET zero3-bench)
  add_test(NAME unit.bench_engine
           COMMAND $<TARGET_FILE:zero3-bench> engine --json --repeats 1 --steps 2 --d-model 32 --layers 2)
  set_tests_properties(unit.bench_engine PROPERTIES LABELS "unit" TIMEOUT 120
                       PASS_REGULAR_EXPRESSION "\"overhead_ratio\"")
endif()
