# The memory plan against measured jobs at world sizes 1, 2 and 4 (tests/mpi/test_memory_plan.cpp): every
# category within 10% (model states 2%), the knobs, 1/N scaling, and the start-up refusal of a job that
# does not fit.
zero3_mpi_test(memory_plan SOURCES mpi/test_memory_plan.cpp LIBS zero3_test_support zero3_train zero3_model_factory NP 1 2 4)
