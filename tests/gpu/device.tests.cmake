# The CUDA device backend. Uses only the public device API, so it builds in every configuration and
# skips (exit 77) where there is no CUDA backend or no GPU.
zero3_gpu_test(device_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_device_cuda.cpp LIBS zero3_device)
