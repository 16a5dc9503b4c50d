# CPU offload (offload_optimizer / offload_param) against on-device training at world sizes 1, 2 and 4:
# bitwise-equal tensors for fp32/bf16/fp16, partial offload, sub-groups, accumulation, Lion, Adagrad, and
# fp16 overflow skips that leave the CPU state untouched.
if(TARGET zero3_engine)
  zero3_mpi_test(offload_equivalence SOURCES mpi/test_offload_equivalence.cpp LIBS zero3_test_model zero3_engine
                 NP 1 2 4)
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
