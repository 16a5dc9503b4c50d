# Every dependency comes from Debian packages (tools/install-deps.sh).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(TBB REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(CLI11 REQUIRED)

# hwloc and xxHash ship no CMake config; found by header and library so CMAKE_PREFIX_PATH works for
# an unpacked prefix too (tools/gpu-check.sh).
# Optional further arguments are path suffixes to search (Debian's alternatives directories, which an
# unpacked prefix has without the alternatives links).
function(zero3_find_c_library target header library)
  find_path(${target}_INCLUDE_DIR ${header} PATH_SUFFIXES ${ARGN} REQUIRED)
  find_library(${target}_LIBRARY ${library} PATH_SUFFIXES ${ARGN} REQUIRED)
  add_library(zero3::${target} UNKNOWN IMPORTED GLOBAL)
  set_target_properties(zero3::${target} PROPERTIES IMPORTED_LOCATION ${${target}_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${${target}_INCLUDE_DIR})
endfunction()
zero3_find_c_library(hwloc hwloc.h hwloc)
zero3_find_c_library(openblas cblas.h openblas openblas-pthread)
zero3_find_c_library(xxhash xxhash.h xxhash)
if(ZERO3_BUILD_TESTS)
  find_package(Catch2 2 REQUIRED)
endif()
