# The training loop of zero3/train (tests/mpi/test_trainer.cpp) with the library's host MLP at world sizes
# 1-4: observers, resume equal to the straight run, errors from observers and options.
zero3_mpi_test(trainer SOURCES mpi/test_trainer.cpp LIBS zero3_train zero3_model_factory NP 1 2 3 4)
# A stop request (zero3/train/preemption.hpp) made on one rank: every rank stops after the same step and
# saves there; the resumed run equals the straight one bit for bit (tests/mpi/test_trainer_preemption.cpp).
zero3_mpi_test(trainer_preemption SOURCES mpi/test_trainer_preemption.cpp LIBS zero3_train zero3_model_factory
               NP 1 2 3)
# The step guard (tests/mpi/test_step_guard.cpp): non-finite losses, the final held-out check, the
# loss-spike detector and its skip, reset_moments and rollback actions.
zero3_mpi_test(step_guard SOURCES mpi/test_step_guard.cpp LIBS zero3_test_support zero3_train zero3_model_factory
               NP 1 2 3)
# Tied embeddings (tests/mpi/test_tied_embeddings.cpp): a Llama whose head borrows the embedding unit, its
# gradients through the engine against the float64 model's, in place at world size 1 and sharded.
zero3_mpi_test(tied_embeddings SOURCES mpi/test_tied_embeddings.cpp LIBS zero3_train zero3_model_factory NP 1 2 4)
# zero3.accumulation's memory policy (tests/mpi/test_accumulation.cpp): the micro-batch follows the planned and
# measured device memory, the losses and samples of the fixed job kept, through a resume.
zero3_mpi_test(accumulation SOURCES mpi/test_accumulation.cpp LIBS zero3_train zero3_model_factory NP 1 2)
