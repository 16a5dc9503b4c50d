# The collective watchdog in one process (tests/unit/test_watchdog.cpp): ZERO3_FAULT parsing, the flight
# recorder (a header private to zero3_comm), one expiry through a fake progress channel.
zero3_unit_test(watchdog SOURCES unit/test_watchdog.cpp LIBS zero3_comm nlohmann_json::nlohmann_json)
target_include_directories(test_watchdog PRIVATE ${PROJECT_SOURCE_DIR}/runtime/comm)
