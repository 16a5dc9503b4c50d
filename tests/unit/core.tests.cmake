zero3_unit_test(core_rng SOURCES unit/test_rng.cpp LIBS zero3_core)
# The event log: JSON lines and the alert command.
zero3_unit_test(core_events SOURCES unit/test_events.cpp LIBS zero3_core nlohmann_json::nlohmann_json)
# The environment variables: docs/environment.md against zero3/core/env.hpp.
zero3_unit_test(env_doc SOURCES unit/test_env_doc.cpp LIBS zero3_core)
target_compile_definitions(test_env_doc PRIVATE ZERO3_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# The process's CPU mask and the compute threads sized from it.
zero3_unit_test(cpus SOURCES unit/test_cpus.cpp LIBS zero3_core)
# JSON-safe text: UTF-8 validation and replacement, JSON string literals.
zero3_unit_test(core_json_text SOURCES unit/test_json_text.cpp LIBS zero3_core nlohmann_json::nlohmann_json)
# Checked integer arithmetic (zero3/core/checked.hpp): products, sums and narrowings at the edges of their types.
zero3_unit_test(core_checked SOURCES unit/test_checked.cpp LIBS zero3_core)
# What a JSON integer is, for every reader of configs and files (zero3/core/json_integer.hpp).
zero3_unit_test(core_json_integer SOURCES unit/test_json_integer.cpp LIBS zero3_core nlohmann_json::nlohmann_json)
