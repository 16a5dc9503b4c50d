# zero3 train under real launchers, each test starting what it needs and stopping it on exit: a one-node
# Slurm cluster (srun --mpi=pmix against mpirun, an sbatch job preempted by scancel --signal=TERM and
# resumed, srun --mpi=none refused), and two "nodes" made of network namespaces joined by a veth pair
# (mpirun across them through an rsh agent; a stopped rank on the second node named in time). Label
# "launcher"; root only (skipped otherwise); not under sanitizers. They take both cores (PROCESSORS 2).
if(TARGET zero3 AND NOT ZERO3_SANITIZE)
  add_test(NAME launcher.slurm
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/slurm_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(launcher.slurm PROPERTIES LABELS "launcher" TIMEOUT 400 PROCESSORS 2)
  add_test(NAME launcher.netns
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/netns_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${ZERO3_MPIEXEC} ${ZERO3_MPIEXEC_FLAGS})
  set_tests_properties(launcher.netns PROPERTIES LABELS "launcher" TIMEOUT 300 PROCESSORS 2)
endif()
