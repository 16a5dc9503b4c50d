# CPU offload (offload_optimizer / offload_param) against on-device training at world sizes 1, 2 and 4:
# bitwise-equal tensors for fp32/bf16/fp16, partial offload, sub-groups, accumulation, Lion, Adagrad, and
# fp16 overflow skips that leave the CPU state untouched.
if(TARGET zero3_engine)
  zero3_mpi_test(offload_equivalence SOURCES mpi/test_offload_equivalence.cpp LIBS zero3_test_support
                 zero3_test_model zero3_train zero3_engine NP 1 2 4)
endif()

# The budget case again without CAP_IPC_LOCK (root may lock past `ulimit -l`; this takes that away), so
# the memlock-limit error is exercised wherever setpriv exists.
find_program(ZERO3_SETPRIV setpriv)
if(TARGET zero3_engine AND ZERO3_SETPRIV)
  add_test(NAME mpi.offload_budget_memlock
           COMMAND ${ZERO3_SETPRIV} --inh-caps=-ipc_lock --bounding-set=-ipc_lock
                   $<TARGET_FILE:test_offload_equivalence> "[budget]")
  set_tests_properties(mpi.offload_budget_memlock PROPERTIES LABELS "mpi" TIMEOUT 120)
endif()

# `zero3-bench offload` at world size 2 runs end to end and reports its figures (not their values).
if(TARGET zero3-bench)
  add_test(NAME mpi.bench_offload.np2
           COMMAND ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS} -np 2 $<TARGET_FILE:zero3-bench> offload --json
                   --offload-param --repeats 1 --steps 2 --d-model 32 --layers 2)
  set_tests_properties(mpi.bench_offload.np2 PROPERTIES LABELS "mpi" TIMEOUT 120
                       PASS_REGULAR_EXPRESSION "\"offload_over_on_device\": [0-9.]+.*\"copies_hidden_share\": [0-9.]+")
endif()
