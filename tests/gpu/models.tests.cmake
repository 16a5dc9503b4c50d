# The CUDA GPT against the host GptModel<double> on the same params (loss, every param's gradient, in fp32,
# bf16 and fp16), eval and empty passes, call order (skipped without a device).
if(TARGET zero3_models_cuda)
  zero3_gpu_test(gpt_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt_cuda.cpp LIBS zero3_models_cuda zero3_models
                 zero3_device fmt::fmt)
endif()
