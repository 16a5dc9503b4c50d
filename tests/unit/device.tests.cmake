# Device layer: the host backend (streams, events, copies, allocation, capacity cap) and the memory
# accounting every Device does. Both also run under TSan and ASan/UBSan (ZERO3_SANITIZE).
zero3_unit_test(device_host SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_device_host.cpp LIBS zero3_device)
zero3_unit_test(memory_tracker SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_memory_tracker.cpp LIBS zero3_device)
