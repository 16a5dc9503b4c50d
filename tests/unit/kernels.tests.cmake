# dtype conversions (exhaustive 16-bit round trips, round-to-nearest-even against a reference) and the
# host kernels against float64 references.
zero3_unit_test(dtype SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dtype.cpp LIBS zero3_core)
zero3_unit_test(kernels_host SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kernels_host.cpp LIBS zero3_device TBB::tbb)
# accumulate and the fused optimizer steps (Adam/AdamW, Lion, Adagrad) against float64 references.
zero3_unit_test(kernels_optim SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kernels_optim.cpp LIBS zero3_device TBB::tbb)
