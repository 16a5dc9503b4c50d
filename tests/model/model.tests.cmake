# The test model family (tests/model/bench_model.cpp, shared with `zero3 bench engine`) and the unsharded
# float64 reference trainer the engine's equivalence tests compare against. No engine code: the unit tests
# of the reference build and run without zero3_engine.
add_library(zero3_test_model STATIC
  ${CMAKE_CURRENT_LIST_DIR}/reference.cpp
  ${PROJECT_SOURCE_DIR}/tools/zero3/bench_model.cpp)
target_include_directories(zero3_test_model PUBLIC ${CMAKE_CURRENT_LIST_DIR} ${PROJECT_SOURCE_DIR}/tools/zero3)
target_link_libraries(zero3_test_model PUBLIC zero3_config zero3_core fmt::fmt)
zero3_project_flags(zero3_test_model)
