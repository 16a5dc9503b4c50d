# Checkpoints through `zero3 train` (tests/mpi/ckpt_train_test.sh): exact resume at 1, 2 and 4 ranks with
# offload on and off in bf16 and fp16, resharding 4 -> 2 and 3 ranks, kill -9 during saves, a full disk,
# bad resumes. Not under sanitizers: it runs a hundred short jobs at full speed.
if(TARGET zero3 AND NOT ZERO3_SANITIZE)
  add_test(NAME mpi.ckpt_train
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/ckpt_train_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.ckpt_train PROPERTIES LABELS "mpi" TIMEOUT 900)
endif()

# The Checkpointer API on the engine, as an embedding trainer uses it (tests/mpi/checkpointer/, a file per
# topic): exact resume (sync and async saves) for AdamW, bf16 + offload, fp16 scaling, Lion, Adagrad, frozen
# params, offload_param with persistent units; refused loads that leave the engine untouched; slice coverage
# and read_state/write_state; a 1-byte staging area; poll/wait ordering of consecutive saves; misuse.
if(TARGET zero3_checkpointer)
  zero3_mpi_test(checkpointer
                 SOURCES mpi/checkpointer/ckpt_fixtures.cpp mpi/checkpointer/resume.cpp
                         mpi/checkpointer/refused_loads.cpp mpi/checkpointer/slices.cpp mpi/checkpointer/staging.cpp
                         mpi/checkpointer/poll.cpp mpi/checkpointer/misuse.cpp
                 LIBS zero3_test_support zero3_test_model zero3_train zero3_checkpointer zero3_engine NP 1 2 3 4)
endif()

# `zero3-bench checkpoint` at world size 2 runs end to end and reports its figures (not their values).
if(TARGET zero3-bench)
  add_test(NAME mpi.bench_checkpoint.np2
           COMMAND ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS} -np 2 $<TARGET_FILE:zero3-bench> checkpoint --json
                   --repeats 1 --steps 1 --d-model 64 --layers 2)
  set_tests_properties(mpi.bench_checkpoint.np2 PROPERTIES LABELS "mpi" TIMEOUT 120
                       PASS_REGULAR_EXPRESSION
                       "\"save_gbps\": [0-9.]+, \"load_gbps\": [0-9.]+, \"raw_write_gbps\": [0-9.]+, \"raw_read_gbps\": [0-9.]+.*\"async_step_ratio\": [0-9.]+")
endif()

# NVMe offload under kill -9 (tests/mpi/nvme_kill_test.sh): a rank killed in the middle of an update and at
# random moments; the next job removes what the dead ranks left under nvme_path and resumes exactly.
if(TARGET zero3 AND NOT ZERO3_SANITIZE)
  add_test(NAME mpi.nvme_kill
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/nvme_kill_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.nvme_kill PROPERTIES LABELS "mpi" TIMEOUT 600)
endif()

# One job per save directory (tests/mpi/save_dir_lock_test.sh): a second job on a directory in use is
# refused on every rank, naming the owner; the lock dies with a killed job.
if(TARGET zero3)
  add_test(NAME mpi.save_dir_lock
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/save_dir_lock_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(mpi.save_dir_lock PROPERTIES LABELS "mpi" TIMEOUT 300)
endif()
