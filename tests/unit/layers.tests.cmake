# docs/design.md's figure of the targets and their links against this build's (cmake/Zero3TargetGraph.cmake).
# The figure is of a build with nvcc, which has every target, so only such builds check it (CI's does).
if(ZERO3_HAVE_CUDA)
  add_test(NAME unit.design_targets COMMAND python3 ${PROJECT_SOURCE_DIR}/tools/target-graph.py check ${PROJECT_BINARY_DIR})
  set_tests_properties(unit.design_targets PROPERTIES LABELS "unit" TIMEOUT 60)
endif()
