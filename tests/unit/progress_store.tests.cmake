# The out-of-band progress store (runtime/comm/health/progress_store.hpp, a header of zero3_comm_health): its MAC
# against the published vectors, the store among client threads, hostile peers, and servers gone or stopped.
zero3_unit_test(progress_store SOURCES unit/test_progress_store.cpp LIBS zero3_comm zero3_comm_health)
