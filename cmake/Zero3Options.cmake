# Warning and sanitizer flags for project targets only (third-party headers are SYSTEM includes).
# ZERO3_WERROR stays ON in CI; tools/gpu-check.sh turns it off so that a newer compiler's new warnings
# cannot block the one validation run on a GPU machine.
option(ZERO3_WERROR "Treat warnings in zero3's own code as errors" ON)
add_library(zero3_warnings INTERFACE)
if(ZERO3_WERROR)
  # GCC 12-13 report -Wrestrict inside std::string's operator+ at -O3 (GCC bug 105329): not our code.
  target_compile_options(zero3_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-error=deprecated-declarations>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-error=restrict>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Werror --Werror=all-warnings>)
else()
  target_compile_options(zero3_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra> $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
endif()

add_library(zero3_sanitizers INTERFACE)
if(ZERO3_SANITIZE)
  target_compile_options(zero3_sanitizers INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${ZERO3_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(zero3_sanitizers INTERFACE -fsanitize=${ZERO3_SANITIZE})
endif()
# The fuzz build instruments every project library for libFuzzer's coverage feedback and checks it with
# ASan and UBSan; only the fuzz targets link libFuzzer itself (tests/fuzz/CMakeLists.txt).
if(ZERO3_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "ZERO3_FUZZ=ON needs clang (libFuzzer), but the C++ compiler is ${CMAKE_CXX_COMPILER_ID} "
                        "${CMAKE_CXX_COMPILER}: configure a separate build with -DCMAKE_CXX_COMPILER=clang++ "
                        "(tools/fuzz.sh does)")
  endif()
  if(ZERO3_SANITIZE)
    message(FATAL_ERROR "ZERO3_FUZZ=ON sets its own sanitizers (address,undefined); leave ZERO3_SANITIZE empty")
  endif()
  target_compile_options(zero3_sanitizers INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
    -fno-sanitize-recover=all>)
  target_link_options(zero3_sanitizers INTERFACE -fsanitize=address,undefined)
endif()

# zero3_add_library(name SOURCES...) : a static library with the project's flags.
function(zero3_project_flags target)
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:zero3_warnings>)  # our flags, not a trainer's
  target_link_libraries(${target} PUBLIC zero3_sanitizers)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
