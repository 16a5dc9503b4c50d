# Install and export, so a C++ trainer can `find_package(zero3 REQUIRED)` and link `zero3::runtime`.
# `cmake --install build --prefix /opt/zero3` gives include/zero3/**, the static libraries behind
# zero3::runtime, bin/zero3 and lib/cmake/zero3/{zero3Config,zero3ConfigVersion,zero3Targets}.cmake.
# Included last by the top-level CMakeLists, once every target and every link exists.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ZERO3_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/zero3)

# The libraries a trainer may link; those not built (yet) are skipped. Whatever of ours they link, even
# privately (a static library's private links are part of its exported link interface), joins the
# export set too, so a new library is exported as soon as zero3_runtime links it. That includes
# zero3_sanitizers (zero3::sanitizers: code linking sanitized static libraries needs the same runtime);
# zero3_warnings is linked as $<BUILD_INTERFACE:...> (Zero3Options) and never leaves the build tree.
# A library's PUBLIC include directories in the source or build tree must be $<BUILD_INTERFACE:...>.
set(ZERO3_INSTALL_LIBRARIES
  zero3_runtime zero3_core zero3_units zero3_device zero3_kernels_host zero3_kernels_cuda zero3_comm zero3_config
  zero3_optim zero3_engine zero3_offload zero3_ckpt zero3_checkpointer zero3_data zero3_train)

# zero3_install_closure(out targets...): the non-imported targets reachable from `targets` through
# INTERFACE_LINK_LIBRARIES, and in `${out}_EXTERNAL` the imported ones. $<BUILD_INTERFACE:...> links
# (zero3_warnings) never reach an install tree and are skipped.
function(zero3_install_closure out)
  set(todo ${ARGN})
  set(ours "")
  set(external "")
  while(todo)
    list(POP_FRONT todo t)
    if(t MATCHES [[^\$<LINK_ONLY:([^$<>]+)>$]])
      set(t ${CMAKE_MATCH_1})
    endif()
    if(t MATCHES [[^(\$<|::@)]] OR NOT TARGET ${t})
      continue()  # another generator expression, a directory marker, a flag or a library path
    endif()
    get_target_property(aliased ${t} ALIASED_TARGET)
    if(aliased)
      set(t ${aliased})
    endif()
    get_target_property(imported ${t} IMPORTED)
    if(imported)
      list(APPEND external ${t})
      continue()
    endif()
    if(t IN_LIST ours)
      continue()
    endif()
    list(APPEND ours ${t})
    get_target_property(links ${t} INTERFACE_LINK_LIBRARIES)
    if(links)
      list(APPEND todo ${links})
    endif()
  endwhile()
  list(REMOVE_DUPLICATES external)
  set(${out} ${ours} PARENT_SCOPE)
  set(${out}_EXTERNAL ${external} PARENT_SCOPE)
endfunction()

set(zero3_install_seeds "")
foreach(t ${ZERO3_INSTALL_LIBRARIES})
  if(TARGET ${t})
    list(APPEND zero3_install_seeds ${t})
  endif()
endforeach()
zero3_install_closure(zero3_exported ${zero3_install_seeds})

# zero3_core -> zero3::core, zero3_runtime -> zero3::runtime, zero3_nccl -> zero3::nccl.
foreach(t ${zero3_exported})
  get_target_property(export_name ${t} EXPORT_NAME)
  if(NOT export_name AND t MATCHES "^zero3_(.+)$")
    set_target_properties(${t} PROPERTIES EXPORT_NAME ${CMAKE_MATCH_1})
  endif()
endforeach()

# What zero3Config.cmake must find before it loads the targets: one switch per imported namespace.
set(ZERO3_CONFIG_NEEDS_THREADS OFF)
set(ZERO3_CONFIG_NEEDS_FMT OFF)
set(ZERO3_CONFIG_NEEDS_NLOHMANN_JSON OFF)
set(ZERO3_CONFIG_NEEDS_TBB OFF)
set(ZERO3_CONFIG_NEEDS_MPI OFF)
set(ZERO3_CONFIG_NEEDS_CUDATOOLKIT OFF)
set(ZERO3_CONFIG_NEEDS_HWLOC OFF)
set(ZERO3_CONFIG_NEEDS_XXHASH OFF)
set(ZERO3_CONFIG_NEEDS_LIBURING OFF)
foreach(dep ${zero3_exported_EXTERNAL})
  if(dep MATCHES "^Threads::")
    set(ZERO3_CONFIG_NEEDS_THREADS ON)
  elseif(dep MATCHES "^fmt::")
    set(ZERO3_CONFIG_NEEDS_FMT ON)
  elseif(dep MATCHES "^nlohmann_json::")
    set(ZERO3_CONFIG_NEEDS_NLOHMANN_JSON ON)
  elseif(dep MATCHES "^TBB::")
    set(ZERO3_CONFIG_NEEDS_TBB ON)
  elseif(dep MATCHES "^MPI::")
    set(ZERO3_CONFIG_NEEDS_MPI ON)
  elseif(dep MATCHES "^CUDA::")
    set(ZERO3_CONFIG_NEEDS_CUDATOOLKIT ON)
  elseif(dep STREQUAL "zero3::hwloc")
    set(ZERO3_CONFIG_NEEDS_HWLOC ON)
  elseif(dep STREQUAL "zero3::xxhash")
    set(ZERO3_CONFIG_NEEDS_XXHASH ON)
  elseif(dep STREQUAL "zero3::liburing")
    set(ZERO3_CONFIG_NEEDS_LIBURING ON)
  else()
    message(WARNING "zero3 install: an exported library links ${dep}, which cmake/zero3Config.cmake.in does "
                    "not find; add a find_dependency for it there and a switch here")
  endif()
endforeach()
# Where this build found them, as hints for the installed config (found again there, never assumed).
set(ZERO3_CONFIG_CUDATOOLKIT_ROOT "")
if(ZERO3_CONFIG_NEEDS_CUDATOOLKIT AND CUDAToolkit_BIN_DIR)
  get_filename_component(ZERO3_CONFIG_CUDATOOLKIT_ROOT ${CUDAToolkit_BIN_DIR} DIRECTORY)
endif()
set(ZERO3_CONFIG_HWLOC_HINTS "")
set(ZERO3_CONFIG_XXHASH_HINTS "")
set(ZERO3_CONFIG_LIBURING_HINTS "")
foreach(lib hwloc xxhash liburing)
  string(TOUPPER ${lib} LIB)
  if(${lib}_INCLUDE_DIR AND ${lib}_LIBRARY)
    get_filename_component(libdir ${${lib}_LIBRARY} DIRECTORY)
    set(ZERO3_CONFIG_${LIB}_HINTS "${${lib}_INCLUDE_DIR};${libdir}")
  endif()
endforeach()

install(TARGETS ${zero3_exported} EXPORT zero3Targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/runtime/include/zero3 DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  PATTERN "*.in" EXCLUDE)
# The headers CMake configured from those templates (zero3/core/version.hpp).
install(DIRECTORY ${PROJECT_BINARY_DIR}/runtime/include/zero3 DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT zero3Targets NAMESPACE zero3:: FILE zero3Targets.cmake DESTINATION ${ZERO3_INSTALL_CMAKEDIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/zero3Config.cmake.in
  ${PROJECT_BINARY_DIR}/zero3Config.cmake INSTALL_DESTINATION ${ZERO3_INSTALL_CMAKEDIR})
# 0.x: a minor release may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zero3ConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zero3Config.cmake ${PROJECT_BINARY_DIR}/zero3ConfigVersion.cmake
  DESTINATION ${ZERO3_INSTALL_CMAKEDIR})

list(JOIN zero3_exported " " zero3_exported_text)
message(STATUS "zero3 install: exports ${zero3_exported_text}")
