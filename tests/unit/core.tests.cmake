zero3_unit_test(core_rng SOURCES unit/test_rng.cpp LIBS zero3_core)
