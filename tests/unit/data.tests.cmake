# The data layer: the Markov source's exact entropy rate against an empirical estimate, token-file format and
# validation errors, and the distributed sampler's stream across world sizes and resumes.
if(TARGET zero3_data)
  zero3_unit_test(data_markov SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data_markov.cpp LIBS zero3_data)
  zero3_unit_test(token_file SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_token_file.cpp LIBS zero3_data)
  zero3_unit_test(sampler SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sampler.cpp LIBS zero3_data)
endif()
