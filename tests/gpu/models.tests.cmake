# The CUDA GPT against the host GptModel<double> on the same params (loss, every param's gradient, in fp32,
# bf16 and fp16), eval and empty passes, call order (skipped without a device).
if(TARGET zero3_models_cuda)
  zero3_gpu_test(gpt_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt_cuda.cpp LIBS zero3_models_cuda zero3_models
                 zero3_device fmt::fmt)
endif()
# The CUDA Llama's kernels against llama_ops, the CUDA tiled attention against the host's, (reads runtime/models and runtime/models/cuda headers
# through zero3_models_cuda_internals), and the model against the host LlamaModel<double>: loss and every gradient with grouped-query
# attention, with and without biases, fp32, bf16 and fp16; a tied output matrix; eval passes, causality,
# planned activation bytes and the calling contract (skipped without a device).
if(TARGET zero3_models_cuda AND ZERO3_HAVE_CUDA)
  zero3_gpu_test(llama_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_llama_cuda.cpp LIBS zero3_models_cuda_internals
                 zero3_device CUDA::cudart fmt::fmt)
endif()
