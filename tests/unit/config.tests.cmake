# Config parser tests: typed values, batch rule, "auto", aliases, diagnostics; and the `zero3 config check`
# command on the shipped configs/ and on fixtures (exit codes 0/1/2, paths named on stderr).
zero3_unit_test(config
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_config_parse.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_config_invalid.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_config_rules.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_config_corpus.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_config_syntax.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_config_removed.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_config_integers.cpp
  LIBS zero3_config nlohmann_json::nlohmann_json)
target_compile_definitions(test_config PRIVATE
  ZERO3_CONFIG_FIXTURES="${CMAKE_CURRENT_LIST_DIR}/../data/configs"
  ZERO3_CONFIGS_DIR="${CMAKE_CURRENT_LIST_DIR}/../../configs")

if(TARGET zero3)
  add_test(NAME unit.config_cli
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/config_cli_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${CMAKE_CURRENT_LIST_DIR}/../data/configs)
  set_tests_properties(unit.config_cli PROPERTIES LABELS "unit" TIMEOUT 120)
endif()

# configs/README.md's key table against the one rendered from the schema rows (tools/gen-config-keys.sh).
zero3_unit_test(config_readme SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_config_readme.cpp LIBS zero3_config
                nlohmann_json::nlohmann_json)
target_compile_definitions(test_config_readme PRIVATE ZERO3_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
