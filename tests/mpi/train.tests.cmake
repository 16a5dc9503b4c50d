# `zero3 train` end to end (tests/mpi/train_cli_test.sh): the tiny GPT job reaches the entropy floor at
# world size 2 with CPU offload, curves are reproducible and world-size independent, bad input fails
# clearly, `zero3-bench train` runs its matrix. Not under sanitizers: it trains for a minute at full speed.
if(TARGET zero3 AND TARGET zero3-bench AND NOT ZERO3_SANITIZE)
  add_test(NAME mpi.train_cli
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train_cli_test.sh $<TARGET_FILE:zero3> $<TARGET_FILE:zero3-bench>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.train_cli PROPERTIES LABELS "mpi" TIMEOUT 600)
endif()

# Preemption and events through `zero3 train` (tests/mpi/preempt_cli_test.sh): SIGTERM to every rank and
# SIGUSR1 to mpirun at a random step stop the 2-rank offload job with a checkpoint (exit 75) that resumes
# bitwise like a straight run; no --save-dir says nothing was saved; a second signal exits at once; the
# alert command receives the events, a fatal error's too. Not under sanitizers: it trains at full speed.
if(TARGET zero3 AND NOT ZERO3_SANITIZE)
  add_test(NAME mpi.train_preempt
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/preempt_cli_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.train_preempt PROPERTIES LABELS "mpi" TIMEOUT 600)
endif()

# `zero3-bench stop-agreement` at world size 2 runs end to end and reports its figures (not their values).
if(TARGET zero3-bench)
  add_test(NAME mpi.bench_stop_agreement.np2
           COMMAND ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS} -np 2 $<TARGET_FILE:zero3-bench> stop-agreement --json
                   --steps 100 --repeats 2)
  set_tests_properties(mpi.bench_stop_agreement.np2 PROPERTIES LABELS "mpi" TIMEOUT 120
                       PASS_REGULAR_EXPRESSION "\"agree_us\": [0-9.]+.*\"barrier_us\": [0-9.]+")
endif()

# `zero3 train` on a job that diverges (tests/mpi/train_nonfinite_cli_test.sh): skipped non-finite steps,
# the stop after max_consecutive, policy abort; never a "done" line or exit 0 over a diverged run.
if(TARGET zero3)
  add_test(NAME mpi.train_nonfinite_cli
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/train_nonfinite_cli_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.train_nonfinite_cli PROPERTIES LABELS "mpi" TIMEOUT 300)
endif()

# `zero3 train --profile` and `zero3 mem report` (tests/mpi/profile_test.sh): a well-formed trace at world
# size 2 (tests/mpi/check_trace.py), per-phase memory in the log and JSONL, the report's tables and PNGs.
if(TARGET zero3 AND NOT ZERO3_SANITIZE)
  add_test(NAME mpi.train_profile
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/profile_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.train_profile PROPERTIES LABELS "mpi" TIMEOUT 300 PROCESSORS 2)
endif()

# DeepSpeed's `tensorboard` block (tests/mpi/tensorboard_test.sh): the event file zero3 writes at world size 2
# read back by a reader written from the format's specification and by the tensorboard package's (skipped,
# exit 77, without it), equal to the run's JSONL metrics; an uncreatable output_path is a named error.
if(TARGET zero3 AND NOT ZERO3_SANITIZE)
  add_test(NAME mpi.train_tensorboard
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/tensorboard_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.train_tensorboard PROPERTIES LABELS "mpi" TIMEOUT 300 PROCESSORS 2)
endif()

# A Llama model in and out of the Hugging Face layout (tests/mpi/hf_llama_test.py): its logits and
# init_from + hf_config against a float64 numpy forward, the hf export byte for byte and sharded, trained
# weights' loss by numpy and transformers (when installed) against zero3's held-out loss, bad checkpoints
# named, the memory of a ranged import. Skips without numpy.
if(TARGET zero3 AND NOT ZERO3_SANITIZE)
  add_test(NAME mpi.hf_llama
           COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/hf_llama_test.py $<TARGET_FILE:zero3>
                   $<TARGET_FILE:llama_logits> ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.hf_llama PROPERTIES LABELS "mpi" TIMEOUT 600 PROCESSORS 2)
endif()

# The memory plan against the operating system (tests/mpi/plan_resident_test.py): each rank's peak resident memory
# (VmHWM) within 10% of `zero3 mem plan`'s prediction, for jobs of 0.4 to 1.3 GiB per rank at world sizes 1 and 2.
if(TARGET zero3 AND NOT ZERO3_SANITIZE)
  add_test(NAME mpi.plan_resident
           COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/plan_resident_test.py $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.plan_resident PROPERTIES LABELS "mpi" TIMEOUT 600 PROCESSORS 2)
endif()

# Activation checkpointing through `zero3 train` (tests/mpi/recompute_cli_test.sh): full and selective train
# bitwise like none (losses and the final checkpoint's bytes) for the GPT, Llama and MLP, fp32 and bf16, at world
# sizes 1 and 2, and hold fewer activations. Not under sanitizers: dozens of short runs.
if(TARGET zero3 AND NOT ZERO3_SANITIZE)
  add_test(NAME mpi.recompute_cli
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/recompute_cli_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.recompute_cli PROPERTIES LABELS "mpi" TIMEOUT 900)
endif()
