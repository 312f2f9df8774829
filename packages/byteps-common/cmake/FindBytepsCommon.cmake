# Finds byteps-common's header-only C++ API (DLPack reader, buffer arguments)
# for the extensions that build on it (byteps-server, -torch, -tf, -mxnet).
#
#   list(APPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_SOURCE_DIR}/../byteps-common/cmake")
#   find_package(BytepsCommon REQUIRED)
#   byteps_add_extension(byteps/torch csrc/dlpack_bridge.cpp)   # the package's private _C
#
# It finds pybind11 (with FindPython) first: the build's Python is also how
# the installed byteps-common is asked where its headers are.
# Where the headers come from, first match wins (byteps-common's README,
# "C++ headers for adapters"):
#   1. -DBYTEPS_COMMON_INCLUDE=<dir>
#   2. this module's own byteps-common: the monorepo sibling (../csrc/include)
#      or the installed wheel (byteps/common/include, next to byteps/common/cmake)
#   3. byteps.common.get_include() in the Python the build runs with
set(PYBIND11_FINDPYTHON ON)
find_package(pybind11 CONFIG REQUIRED)

set(BYTEPS_COMMON_INCLUDE "" CACHE PATH "Directory holding byteps/dlpack.h (byteps.common.get_include())")
if(NOT BYTEPS_COMMON_INCLUDE)
  foreach(_candidate "${CMAKE_CURRENT_LIST_DIR}/../csrc/include" "${CMAKE_CURRENT_LIST_DIR}/../include")
    if(NOT BYTEPS_COMMON_INCLUDE AND EXISTS "${_candidate}/byteps/dlpack.h")
      get_filename_component(BYTEPS_COMMON_INCLUDE "${_candidate}" ABSOLUTE)
    endif()
  endforeach()
endif()
if(NOT BYTEPS_COMMON_INCLUDE)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import byteps.common; print(byteps.common.get_include())"
    OUTPUT_VARIABLE BYTEPS_COMMON_INCLUDE ERROR_VARIABLE _byteps_common_error
    RESULT_VARIABLE _byteps_common_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _byteps_common_rc EQUAL 0)
    set(BYTEPS_COMMON_INCLUDE "")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(BytepsCommon
  REQUIRED_VARS BYTEPS_COMMON_INCLUDE
  REASON_FAILURE_MESSAGE
    "byteps-common's C++ headers were not found next to this module, and byteps.common.get_include() \
failed in ${Python_EXECUTABLE}: ${_byteps_common_error} Install byteps-common in the build environment \
(then pip wheel --no-build-isolation) or pass -DBYTEPS_COMMON_INCLUDE=<dir>.")
if(BytepsCommon_FOUND AND NOT EXISTS "${BYTEPS_COMMON_INCLUDE}/byteps/dlpack.h")
  message(FATAL_ERROR "BYTEPS_COMMON_INCLUDE=${BYTEPS_COMMON_INCLUDE} holds no byteps/dlpack.h")
endif()
if(BytepsCommon_FOUND AND NOT TARGET BytepsCommon::headers)
  add_library(BytepsCommon::headers INTERFACE IMPORTED)
  set_target_properties(BytepsCommon::headers PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${BYTEPS_COMMON_INCLUDE}")
  message(STATUS "byteps-common C++ headers: ${BYTEPS_COMMON_INCLUDE}")
endif()

# byteps_add_extension(<install dir> <sources>...): the package's extension
# module _C (C++17, -O3, byteps-common's headers), installed into <install dir>
# of the wheel. No framework is linked: extensions exchange raw buffers.
function(byteps_add_extension destination)
  # No link-time optimisation, as in byteps-common's own CMakeLists.txt: one translation unit per
  # hot loop, so it made nothing faster.
  set(CMAKE_INTERPROCEDURAL_OPTIMIZATION OFF)
  pybind11_add_module(_C ${ARGN})
  target_compile_features(_C PRIVATE cxx_std_17)
  target_link_libraries(_C PRIVATE BytepsCommon::headers)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(_C PRIVATE -O3)
  endif()
  install(TARGETS _C DESTINATION "${destination}")
endfunction()
