# The entropy-floor check of zero3/train/sinks.hpp: below the floor stops the run, NaN and Inf do not.
zero3_unit_test(train_entropy_floor SOURCES unit/test_entropy_floor.cpp LIBS zero3_train zero3_core)

# TensorBoard's framing checksum against the published CRC-32C check values, and a writer's file layout.
zero3_unit_test(train_tensorboard SOURCES unit/test_tensorboard.cpp LIBS zero3_train zero3_core)
