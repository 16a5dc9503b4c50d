# LR schedules and the fp16 loss scaler against DeepSpeed's (deepspeed/runtime/lr_schedules.py,
# deepspeed/runtime/fp16/loss_scaler.py); and `zero3 config lr-schedule` end to end on the shipped configs/.
zero3_unit_test(optim
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_lr_schedule.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_loss_scaler.cpp
  LIBS zero3_optim)

if(TARGET zero3)
  add_test(NAME unit.optim_lr_schedule_cli
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/lr_schedule_cli_test.sh $<TARGET_FILE:zero3>
                   ${CMAKE_CURRENT_LIST_DIR}/../../configs ${CMAKE_CURRENT_LIST_DIR}/../data/configs)
  set_tests_properties(unit.optim_lr_schedule_cli PROPERTIES LABELS "unit" TIMEOUT 120)
endif()
