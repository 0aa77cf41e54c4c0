# One step of the fuzz tests (cmake -P), printing every command so that a failure under
# ctest --output-on-failure shows what went wrong. See fuzz_tests.cmake.
#
#   -D STEP=build        configure and build the fuzz project
#                        SOURCE_DIR, BUILD_DIR, CXX_COMPILER, GENERATOR, [MAKE_PROGRAM], [KOKKOS_DIR]
#   -D STEP=fuzz         fuzz on a fresh copy of the seed corpus; fail on any finding
#                        FUZZER, SEEDS, WORK_DIR, SECONDS
#   -D STEP=unavailable  fail, saying the fuzzer cannot be built here
cmake_minimum_required(VERSION 3.25)

function(run_step what)
  string(JOIN " " printable ${ARGN})
  message(STATUS "run_fuzz: ${what}: ${printable}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "run_fuzz: ${what} failed (${result})")
  endif()
endfunction()

if(STEP STREQUAL "unavailable")
  message(FATAL_ERROR "run_fuzz: the fuzz tests need clang++ with libFuzzer, and none was found "
                      "when this build was configured. Install clang and libclang-rt-dev, or set "
                      "KOMPRESS_FUZZ_CXX to a clang++, or configure with -DKOMPRESS_ENABLE_FUZZ=OFF.")
endif()

if(STEP STREQUAL "build")
  # The build folder is kept between runs: after the first, only a changed header recompiles.
  set(configure_args -S "${SOURCE_DIR}" -B "${BUILD_DIR}" -G "${GENERATOR}"
                     "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
  if(MAKE_PROGRAM)
    list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
  endif()
  if(KOKKOS_DIR)
    list(APPEND configure_args "-DKokkos_DIR=${KOKKOS_DIR}")
  endif()
  run_step("configure" "${CMAKE_COMMAND}" ${configure_args})
  run_step("build" "${CMAKE_COMMAND}" --build "${BUILD_DIR}")
  return()
endif()

if(NOT STEP STREQUAL "fuzz")
  message(FATAL_ERROR "run_fuzz: unknown STEP '${STEP}'")
endif()

if(NOT EXISTS "${FUZZER}")
  message(FATAL_ERROR "run_fuzz: no fuzzer at ${FUZZER} (the test fuzz.build makes it)")
endif()
file(GLOB seeds "${SEEDS}/*.kmpz")
list(LENGTH seeds seed_count)
if(seed_count EQUAL 0)
  message(FATAL_ERROR "run_fuzz: no seeds in ${SEEDS} (the test fuzz.seeds writes them)")
endif()

# A fresh copy: libFuzzer adds what it finds to the corpus folder, and each run should start
# from the seeds alone so that its length does not grow run after run. Crash inputs are kept.
set(corpus "${WORK_DIR}/corpus")
set(artifacts "${WORK_DIR}/artifacts")
file(REMOVE_RECURSE "${corpus}")
file(MAKE_DIRECTORY "${corpus}" "${artifacts}")
file(COPY ${seeds} DESTINATION "${corpus}")
file(GLOB old_artifacts "${artifacts}/*")

set(command "${FUZZER}" "-max_total_time=${SECONDS}" -timeout=10 -rss_limit_mb=2048
            -print_final_stats=1 "-artifact_prefix=${artifacts}/" "${corpus}")
string(JOIN " " printable ${command})
message(STATUS "run_fuzz: fuzz ${seed_count} seeds for ${SECONDS} s: ${printable}")
execute_process(COMMAND ${command} RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  file(GLOB new_artifacts "${artifacts}/*")
  if(old_artifacts)
    list(REMOVE_ITEM new_artifacts ${old_artifacts})
  endif()
  string(JOIN "\n  " listed "" ${new_artifacts})
  message(FATAL_ERROR "run_fuzz: the fuzzer found a bug (exit status ${result}); its input:${listed}\n"
                      "Reproduce with: ${FUZZER} <input>")
endif()
