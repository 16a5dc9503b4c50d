# The CPU optimizer of offload/: the host device's fused kernels and every SIMD path against the scalar
# path bit for bit, the 16-bit conversions, GradStats, CpuThreadPool's tiles and binding, ZERO3_CPU_SIMD.
# The program has its own main (--simd-path): unit.cpu_optimizer runs the path-independent test cases, and
# unit.cpu_optimizer.<path> the [simd] ones against that path, Skipped (exit 77) where this CPU or build
# lacks it or ZERO3_CPU_SIMD names a narrower path.
add_executable(test_cpu_optimizer ${CMAKE_CURRENT_LIST_DIR}/test_cpu_optimizer.cpp)
target_link_libraries(test_cpu_optimizer PRIVATE Catch2::Catch2 zero3_offload zero3_device TBB::tbb)
target_include_directories(test_cpu_optimizer PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/support)
zero3_project_flags(test_cpu_optimizer)
add_test(NAME unit.cpu_optimizer COMMAND test_cpu_optimizer "~[simd]")
set_tests_properties(unit.cpu_optimizer PROPERTIES LABELS "unit" TIMEOUT 300)
foreach(path avx2 avx512)
  add_test(NAME unit.cpu_optimizer.${path} COMMAND test_cpu_optimizer --simd-path ${path} "[simd]")
  set_tests_properties(unit.cpu_optimizer.${path} PROPERTIES LABELS "unit" TIMEOUT 300)
endforeach()
