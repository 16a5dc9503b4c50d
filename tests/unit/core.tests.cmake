zero3_unit_test(core_rng SOURCES unit/test_rng.cpp LIBS zero3_core)
# The event log: JSON lines and the alert command.
zero3_unit_test(core_events SOURCES unit/test_events.cpp LIBS zero3_core nlohmann_json::nlohmann_json)
