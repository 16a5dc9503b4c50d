# The CUDA kernels against the host backend on the same inputs (skipped without a device).
zero3_gpu_test(kernels_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kernels_cuda.cpp LIBS zero3_device)
