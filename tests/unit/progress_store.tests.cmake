# The out-of-band progress store (runtime/comm/progress_store.hpp, a header private to zero3_comm): its MAC
# against the published vectors, the store among client threads, hostile peers, and servers gone or stopped.
zero3_unit_test(progress_store SOURCES unit/test_progress_store.cpp LIBS zero3_comm)
target_include_directories(test_progress_store PRIVATE ${PROJECT_SOURCE_DIR}/runtime/comm)
