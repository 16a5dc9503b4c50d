# The test model family (model.cpp) and the unsharded float64 reference trainer (reference.cpp) the
# engine's equivalence tests compare against. No engine code: the unit tests of the reference build and run
# without zero3_engine.
add_library(zero3_test_model STATIC ${CMAKE_CURRENT_LIST_DIR}/reference.cpp ${CMAKE_CURRENT_LIST_DIR}/model.cpp)
target_include_directories(zero3_test_model PUBLIC ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(zero3_test_model PUBLIC zero3_config zero3_core fmt::fmt)
zero3_project_flags(zero3_test_model)
