# The CPU optimizer of offload/: every SIMD path and the host device's fused kernels against the scalar
# path bit for bit, the 16-bit conversions, GradStats, CpuThreadPool's tiles and binding, ZERO3_CPU_SIMD.
zero3_unit_test(cpu_optimizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_optimizer.cpp
                LIBS zero3_offload zero3_device TBB::tbb)
