# The stop request of zero3/train/preemption.hpp: flag, handlers installed and restored, a repeated signal
# ending the process, the ranks' agreement (through a bootstrap whose other ranks the test plays), events.
zero3_unit_test(train_preemption SOURCES unit/test_preemption.cpp LIBS zero3_train zero3_core
                nlohmann_json::nlohmann_json)
