# The host GPT (runtime/models): backward against central finite differences in float64 (every element of
# every param), float against double, causality, config validation, and memorization with a few Adam steps.
if(TARGET zero3_models)
  zero3_unit_test(gpt SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt.cpp LIBS zero3_models fmt::fmt)
  # Thread-count independence and the bf16 products' error bounds; reads gpt_ops.hpp (zero3_models_internals).
  zero3_unit_test(gpt_host_compute SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt_host_compute.cpp
                  LIBS zero3_models_internals TBB::tbb fmt::fmt)
  # Signals during host matrix products run their handlers on the thread's stack (oneDNN's AVX2 fp32 GEMM
  # kernel, forced where the CPU has more, points the stack pointer into the heap while it runs).
  # Not under ThreadSanitizer: it defers asynchronous signals and runs their handlers from its own interceptors,
  # so where a handler's frame lies says nothing about the interrupted kernel.
  if(NOT ZERO3_SANITIZE MATCHES "thread")
    zero3_unit_test(gemm_signals SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gemm_signals.cpp LIBS zero3_models_internals)
    set_tests_properties(unit.gemm_signals PROPERTIES ENVIRONMENT ONEDNN_MAX_CPU_ISA=AVX2)
  endif()
  # The tiled attention against full attention in float64; reads flash_attention.hpp (zero3_models_internals).
  zero3_unit_test(flash_attention SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_flash_attention.cpp
                  LIBS zero3_models_internals fmt::fmt)
  # The vectorized tanh of the host models against tanh in double; reads vector_math.hpp (zero3_models_internals).
  zero3_unit_test(vector_math SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vector_math.cpp LIBS zero3_models_internals)
  # The host Llama-family decoder: finite differences for every param, float vs double, causality.
  zero3_unit_test(llama SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_llama.cpp LIBS zero3_models_internals fmt::fmt)
  # The host Llama's logits from a Hugging Face directory, for tests/mpi/hf_llama_test.py.
  add_executable(llama_logits ${CMAKE_CURRENT_LIST_DIR}/llama_logits.cpp)
  target_link_libraries(llama_logits PRIVATE zero3_model_factory zero3_models zero3_ckpt zero3_config)
  zero3_project_flags(llama_logits)
  zero3_unit_test(mlp SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_mlp.cpp LIBS zero3_models zero3_data fmt::fmt)
  # The models' planned activations (the memory plan's activations category) against what they hold.
  zero3_unit_test(activation_plan SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_activation_plan.cpp LIBS zero3_models
                  fmt::fmt)
  # Sizes at the edges of their types: param counts, widths, activation plans, the check before units exist.
  zero3_unit_test(model_sizes SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_model_sizes.cpp
                  LIBS zero3_model_factory zero3_models zero3_train zero3_config)
endif()
