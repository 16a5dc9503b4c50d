# World: rank/size from launcher environments, read through a lookup function (no real environment).
zero3_unit_test(world SOURCES unit/test_world.cpp LIBS zero3_comm)
