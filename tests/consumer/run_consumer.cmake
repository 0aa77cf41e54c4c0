# Runs one consumer test step (cmake -P), printing every command and its output so that a
# failure under ctest --output-on-failure shows what went wrong.
#
#   -D STEP=install       cmake --install BUILD_DIR into PREFIX (emptied first)
#   -D STEP=consumer      configure, build and run tests/consumer in WORK_DIR (emptied first)
#
# install:  BUILD_DIR, PREFIX, [CONFIG]
# consumer: WORK_DIR, CONSUMER_DIR, MODE (find_package|add_subdirectory), GENERATOR,
#           [MAKE_PROGRAM], CXX_COMPILER, [BUILD_TYPE], [PREFIX] or [KOMPRESS_DIR] (find_package),
#           [KOMPRESS_SOURCE_DIR] (add_subdirectory), [KOKKOS_DIR], [WITH_MPI],
#           [IMPLICIT_MPI] (find_package without COMPONENTS mpi), [NO_MPI],
#           [MPIEXEC], [MPIEXEC_NUMPROC_FLAG], [EXPECT_CONFIGURE_ERROR] (a regex: configuring
#           must fail with a message matching it; nothing is built)
cmake_minimum_required(VERSION 3.25)

function(run_step what)
  string(JOIN " " printable ${ARGN})
  message(STATUS "run_consumer: ${what}: ${printable}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "run_consumer: ${what} failed (${result})")
  endif()
endfunction()

foreach(required IN ITEMS STEP)
  if(NOT DEFINED ${required})
    message(FATAL_ERROR "run_consumer: -D ${required}=... is required")
  endif()
endforeach()

if(STEP STREQUAL "install")
  file(REMOVE_RECURSE "${PREFIX}")
  set(config_args)
  if(CONFIG)
    set(config_args --config "${CONFIG}")
  endif()
  run_step("install kompress" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
           ${config_args})
  if(NOT EXISTS "${PREFIX}/include/kompress/kompress.hpp")
    message(FATAL_ERROR "run_consumer: the install has no include/kompress/kompress.hpp")
  endif()
  return()
endif()

if(NOT STEP STREQUAL "consumer")
  message(FATAL_ERROR "run_consumer: unknown STEP '${STEP}'")
endif()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(configure_args
  -S "${CONSUMER_DIR}" -B "${WORK_DIR}" -G "${GENERATOR}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}"
  "-DKOMPRESS_CONSUMER_MODE=${MODE}")
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(MODE STREQUAL "find_package" AND KOMPRESS_DIR)
  list(APPEND configure_args "-Dkompress_DIR=${KOMPRESS_DIR}")
elseif(MODE STREQUAL "find_package")
  list(APPEND configure_args "-DCMAKE_PREFIX_PATH=${PREFIX}")
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND configure_args "-DKOMPRESS_SOURCE_DIR=${KOMPRESS_SOURCE_DIR}")
endif()
if(KOKKOS_DIR)
  list(APPEND configure_args "-DKokkos_DIR=${KOKKOS_DIR}")
endif()
if(WITH_MPI)
  list(APPEND configure_args -DKOMPRESS_CONSUMER_MPI=ON)
endif()
if(IMPLICIT_MPI)
  list(APPEND configure_args -DKOMPRESS_CONSUMER_MPI_COMPONENT=OFF)
endif()
if(NO_MPI)
  list(APPEND configure_args -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON)
endif()

if(DEFINED EXPECT_CONFIGURE_ERROR)
  string(JOIN " " printable ${configure_args})
  message(STATUS "run_consumer: configure (must fail): cmake ${printable}")
  execute_process(COMMAND "${CMAKE_COMMAND}" ${configure_args}
                  RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  message("${output}")
  if(result EQUAL 0)
    message(FATAL_ERROR "run_consumer: configuring succeeded, but it must fail")
  endif()
  if(NOT output MATCHES "${EXPECT_CONFIGURE_ERROR}")
    message(FATAL_ERROR "run_consumer: the configure error does not match '${EXPECT_CONFIGURE_ERROR}'")
  endif()
  message(STATUS "run_consumer: configuring failed as expected")
  return()
endif()

run_step("configure" "${CMAKE_COMMAND}" ${configure_args})
run_step("build" "${CMAKE_COMMAND}" --build "${WORK_DIR}")
run_step("run consumer" "${WORK_DIR}/consumer")
if(WITH_MPI)
  run_step("run consumer_mpi" "${MPIEXEC}" ${MPIEXEC_NUMPROC_FLAG} 2 "${WORK_DIR}/consumer_mpi")
endif()
