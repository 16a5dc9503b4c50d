# The CUDA kernels against the host backend on the same inputs (skipped without a device).
zero3_gpu_test(kernels_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kernels_cuda.cpp LIBS zero3_device)
# The CUDA accumulate and optimizer steps against the host backend, bit for bit (skipped without a device).
zero3_gpu_test(kernels_optim_cuda SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kernels_optim_cuda.cpp LIBS zero3_device)
