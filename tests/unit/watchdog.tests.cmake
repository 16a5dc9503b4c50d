# The collective watchdog in one process (tests/unit/test_watchdog.cpp): ZERO3_FAULT parsing, the flight
# recorder (a header of zero3_comm_health, runtime/comm/health), one expiry through a fake progress channel.
zero3_unit_test(watchdog SOURCES unit/test_watchdog.cpp LIBS zero3_comm zero3_comm_health nlohmann_json::nlohmann_json)
