# kompress_add_test: one doctest executable, registered with ctest.
#
#   kompress_add_test(NAME <name> {SOURCES <file>... | EXECUTABLE <built>} [ARGS <arg>...]
#                     [MPI_RANKS <n>...] [LABELS <label>...] [TIMEOUT <seconds>])
#
# Builds the executable test_<name> from SOURCES, linked with doctest, kompress::kompress and
# support/real_data.hpp (the real data), plus the shared main (tests/support/doctest_main.cpp, which
# holds Kokkos initialized for the run). With EXECUTABLE instead of SOURCES it builds nothing and
# registers the executable test_<built> that an earlier kompress_add_test(NAME <built>) built
# (the same suite run with other ARGS, such as a doctest filter). ARGS follow the executable on
# its command line. Without MPI_RANKS it registers the ctest test <name>.
# With MPI_RANKS it links kompress::mpi and the MPI main (tests/support/doctest_mpi_main.cpp)
# instead and registers <name>.np<N> for each N, run as
#   ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} N ${MPIEXEC_PREFLAGS} test_<name> ${MPIEXEC_POSTFLAGS} <ARGS>
# If MPI was not found, an MPI test is not built and a message says so.
#
# Every test gets OMP_NUM_THREADS (KOMPRESS_TEST_THREADS, split between the ranks, at least 1),
# OMP_PROC_BIND=false, KOKKOS_DISABLE_WARNINGS=1 (Kokkos 5 rejects "ON") and KOMPRESS_DATA_DIR;
# MPI tests also get the label "mpi". TIMEOUT defaults to KOMPRESS_TEST_TIMEOUT. The executables get the
# project's warnings and, with KOMPRESS_SANITIZE, the sanitizers.
#
# Expects the targets doctest::doctest and kompress_test_support (tests/CMakeLists.txt).
include_guard(GLOBAL)
include(KompressTargetDefaults)

set(KOMPRESS_TEST_THREADS 2 CACHE STRING
    "Threads a test may use in all (OMP_NUM_THREADS, divided among the ranks of an MPI test)")
set(KOMPRESS_TEST_TIMEOUT 300 CACHE STRING "Default ctest timeout of a kompress test, seconds")

# The two mains, compiled once and linked into every test executable.
function(_kompress_test_main target source)
  add_library(${target} OBJECT "${source}")
  target_link_libraries(${target} PUBLIC kompress_test_support ${ARGN})
  kompress_target_defaults(${target})
endfunction()

# kompress_test_environment(<out_var> <ranks>): the ENVIRONMENT list kompress_add_test gives a
# test of <ranks> ranks; for tests registered by hand.
function(kompress_test_environment out_var ranks)
  math(EXPR threads "${KOMPRESS_TEST_THREADS} / ${ranks}")
  if(threads LESS 1)
    set(threads 1)
  endif()
  set(environment
    "OMP_NUM_THREADS=${threads}"
    "OMP_PROC_BIND=false"
    # ctest runs two tests at once on two cores: idle OpenMP threads must sleep, not spin,
    # or each test waits whole scheduler slices for the other one's spinning threads.
    "OMP_WAIT_POLICY=passive"
    "KOKKOS_DISABLE_WARNINGS=1"
    "KOMPRESS_DATA_DIR=${KOMPRESS_DATA_DIR}")
  if(KOMPRESS_SANITIZE)
    # A sanitizer report fails the test and shows where (leaks included; MPICH needs no
    # suppressions here).
    list(APPEND environment
      "ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1:check_initialization_order=1"
      "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")
  endif()
  set(${out_var} "${environment}" PARENT_SCOPE)
endfunction()

function(kompress_add_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME;TIMEOUT;EXECUTABLE" "SOURCES;ARGS;MPI_RANKS;LABELS")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kompress_add_test: unknown arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT arg_NAME OR (NOT arg_SOURCES AND NOT arg_EXECUTABLE) OR (arg_SOURCES AND arg_EXECUTABLE))
    message(FATAL_ERROR "kompress_add_test: NAME and either SOURCES or EXECUTABLE are required")
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT ${KOMPRESS_TEST_TIMEOUT})
  endif()
  foreach(ranks IN LISTS arg_MPI_RANKS)
    if(NOT ranks MATCHES "^[1-9][0-9]*$")
      message(FATAL_ERROR "kompress_add_test(${arg_NAME}): MPI_RANKS must be positive integers, got '${ranks}'")
    endif()
  endforeach()
  if(arg_MPI_RANKS AND NOT TARGET kompress::mpi)
    message(STATUS "kompress: test ${arg_NAME} needs MPI, which was not found; not built")
    return()
  endif()

  if(arg_EXECUTABLE)
    set(target test_${arg_EXECUTABLE})
    if(NOT TARGET ${target})
      message(FATAL_ERROR "kompress_add_test(${arg_NAME}): no test executable ${target} was built before")
    endif()
  else()
    set(target test_${arg_NAME})
    add_executable(${target} ${arg_SOURCES})
    kompress_target_defaults(${target})
    if(arg_MPI_RANKS)
      target_link_libraries(${target} PRIVATE kompress_doctest_mpi_main kompress::mpi)
    else()
      target_link_libraries(${target} PRIVATE kompress_doctest_main)
    endif()
  endif()

  if(NOT arg_MPI_RANKS)
    add_test(NAME ${arg_NAME} COMMAND ${target} ${arg_ARGS})
    kompress_test_environment(environment 1)
    set_tests_properties(${arg_NAME} PROPERTIES
      ENVIRONMENT "${environment}" LABELS "${arg_LABELS}" TIMEOUT ${arg_TIMEOUT})
    return()
  endif()
  foreach(ranks IN LISTS arg_MPI_RANKS)
    set(test ${arg_NAME}.np${ranks})
    add_test(NAME ${test}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPIEXEC_PREFLAGS}
              $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${arg_ARGS})
    kompress_test_environment(environment ${ranks})
    set_tests_properties(${test} PROPERTIES
      ENVIRONMENT "${environment}" LABELS "mpi;${arg_LABELS}" TIMEOUT ${arg_TIMEOUT}
      PROCESSORS ${ranks})
  endforeach()
endfunction()

# Set up once, where this module is included (tests/CMakeLists.txt): the mains.
if(NOT TARGET kompress_doctest_main)
  _kompress_test_main(kompress_doctest_main
    "${PROJECT_SOURCE_DIR}/tests/support/doctest_main.cpp")
  if(TARGET kompress::mpi)
    _kompress_test_main(kompress_doctest_mpi_main
      "${PROJECT_SOURCE_DIR}/tests/support/doctest_mpi_main.cpp" kompress::mpi)
  endif()
endif()
