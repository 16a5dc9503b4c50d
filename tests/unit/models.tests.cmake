# The host GPT (runtime/models): backward against central finite differences in float64 (every element of
# every param), float against double, causality, config validation, and memorization with a few Adam steps.
if(TARGET zero3_models)
  zero3_unit_test(gpt SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt.cpp LIBS zero3_models fmt::fmt)
  zero3_unit_test(mlp SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_mlp.cpp LIBS zero3_models zero3_data fmt::fmt)
endif()
