# The float64 reference model: finite-difference check of the hand-written backward (every param), the
# float model against the double one, and the reference's optimizer, schedule and loss-scale formulas on
# hand-computed cases.
zero3_unit_test(reference_model SOURCES unit/test_reference_model.cpp LIBS zero3_test_model)
