# The checkpoint format (zero3_ckpt): rank files, manifest, commit protocol, verified and resharded reads,
# corruption and write failures, safetensors and Hugging Face export; and `zero3 ckpt info/export` end to
# end, the export read back by Python's safetensors (skipped, exit 77, where safetensors or numpy is missing).
zero3_unit_test(ckpt SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ckpt.cpp LIBS zero3_ckpt)

add_executable(make_test_checkpoint ${CMAKE_CURRENT_LIST_DIR}/make_test_checkpoint.cpp)
target_link_libraries(make_test_checkpoint PRIVATE zero3_ckpt)
zero3_project_flags(make_test_checkpoint)

if(TARGET zero3)
  add_test(NAME unit.ckpt_export_safetensors
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/ckpt_export_safetensors.sh $<TARGET_FILE:zero3>
                   $<TARGET_FILE:make_test_checkpoint>)
  set_tests_properties(unit.ckpt_export_safetensors PROPERTIES LABELS "unit" TIMEOUT 300)
endif()

# The safetensors reader (zero3/ckpt/safetensors.hpp) over files written byte by byte here: dtypes read back,
# ranged reads, sharded checkpoints with an index, and every malformed header named by file and tensor.
zero3_unit_test(safetensors_reader SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_safetensors_reader.cpp LIBS zero3_ckpt)

# The save directory's lock (zero3/ckpt/save_dir_lock.hpp): a second holder refused with the first named,
# the lock released when its holder goes away or is killed.
zero3_unit_test(save_dir_lock SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_save_dir_lock.cpp LIBS zero3_checkpointer)
