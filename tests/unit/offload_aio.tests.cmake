# Direct asynchronous file I/O of the NVMe offload (io_uring and the pread/pwrite fallback) and the
# nvme_path start-up check, on files in a scratch directory under $TMPDIR.
zero3_unit_test(aio SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_aio.cpp LIBS zero3_offload)
