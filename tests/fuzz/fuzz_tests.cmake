# The decompress fuzzer under ctest (included from tests/CMakeLists.txt). Labeled "fuzz".
#
#   fuzz.seeds       make_fuzz_seeds writes the seed corpus, ~20 small valid streams and two
#                    decompression bombs, into <build>/tests/fuzz_corpus (fixture kompress_fuzz_corpus)
#   fuzz.build       configures and builds tests/fuzz (a project of its own) with clang++
#                    -fsanitize=fuzzer,address,undefined in <build>/tests/fuzz_build
#                                                                     (fixture kompress_fuzzer)
#   fuzz.decompress  runs fuzz_decompress for KOMPRESS_FUZZ_SECONDS on a fresh copy of the
#                    corpus in <build>/tests/fuzz_run; any crash, sanitizer report, timeout
#                    (-timeout=10 per input) or memory blow-up (-rss_limit_mb=2048) fails it,
#                    and the input is kept in <build>/tests/fuzz_run/artifacts
#
# Options: KOMPRESS_ENABLE_FUZZ (default ON; OFF registers nothing), KOMPRESS_FUZZ_SECONDS
# (default 60), KOMPRESS_FUZZ_CXX (the clang++ to build with, found on PATH). Without a
# clang++ the test fuzz.unavailable fails and says why, rather than the fuzzing silently not
# happening. A KOMPRESS_SANITIZE build registers nothing: the fuzzer is an ASan+UBSan build
# already, and the sanitizer pass of CI (which excludes only the labels consumer|slow) would
# otherwise run it a second time.
option(KOMPRESS_ENABLE_FUZZ "Register the libFuzzer tests of decompress (label fuzz; they need clang++ with libFuzzer)" ON)
set(KOMPRESS_FUZZ_SECONDS 60 CACHE STRING "How long the ctest test fuzz.decompress fuzzes, seconds")

if(NOT KOMPRESS_ENABLE_FUZZ)
  return()
endif()
if(KOMPRESS_SANITIZE)
  message(STATUS "kompress: KOMPRESS_SANITIZE is ON; the fuzz tests (themselves sanitized) are "
                 "registered only in the non-sanitizer build")
  return()
endif()

set(fuzz_script "${CMAKE_CURRENT_LIST_DIR}/run_fuzz.cmake")

if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  set(KOMPRESS_FUZZ_CXX "${CMAKE_CXX_COMPILER}" CACHE FILEPATH "clang++ for the libFuzzer target")
else()
  find_program(KOMPRESS_FUZZ_CXX NAMES clang++ clang++-22 clang++-21 clang++-20 clang++-19 clang++-18
               DOC "clang++ for the libFuzzer target")
endif()
if(NOT KOMPRESS_FUZZ_CXX)
  message(WARNING "kompress: no clang++ found for the fuzz tests; the test fuzz.unavailable will "
                  "fail. Install clang and libclang-rt-dev, set KOMPRESS_FUZZ_CXX, or configure "
                  "with -DKOMPRESS_ENABLE_FUZZ=OFF.")
  add_test(NAME fuzz.unavailable
    COMMAND "${CMAKE_COMMAND}" -DSTEP=unavailable -P "${fuzz_script}")
  set_tests_properties(fuzz.unavailable PROPERTIES LABELS fuzz)
  return()
endif()

add_executable(make_fuzz_seeds "${CMAKE_CURRENT_LIST_DIR}/make_fuzz_seeds.cpp")
target_link_libraries(make_fuzz_seeds PRIVATE kompress::kompress)
kompress_target_defaults(make_fuzz_seeds)

set(fuzz_corpus "${CMAKE_CURRENT_BINARY_DIR}/fuzz_corpus")
set(fuzz_build "${CMAKE_CURRENT_BINARY_DIR}/fuzz_build")
set(fuzz_run "${CMAKE_CURRENT_BINARY_DIR}/fuzz_run")

add_test(NAME fuzz.seeds COMMAND make_fuzz_seeds "${fuzz_corpus}")

set(fuzz_build_args
  "-DSOURCE_DIR=${CMAKE_CURRENT_LIST_DIR}"
  "-DBUILD_DIR=${fuzz_build}"
  "-DCXX_COMPILER=${KOMPRESS_FUZZ_CXX}"
  "-DGENERATOR=${CMAKE_GENERATOR}")
if(CMAKE_MAKE_PROGRAM)
  list(APPEND fuzz_build_args "-DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}")
endif()
if(Kokkos_DIR)
  list(APPEND fuzz_build_args "-DKOKKOS_DIR=${Kokkos_DIR}")
endif()
add_test(NAME fuzz.build COMMAND "${CMAKE_COMMAND}" -DSTEP=build ${fuzz_build_args} -P "${fuzz_script}")

add_test(NAME fuzz.decompress
  COMMAND "${CMAKE_COMMAND}" -DSTEP=fuzz
          "-DFUZZER=${fuzz_build}/fuzz_decompress"
          "-DSEEDS=${fuzz_corpus}"
          "-DWORK_DIR=${fuzz_run}"
          "-DSECONDS=${KOMPRESS_FUZZ_SECONDS}"
          -P "${fuzz_script}")

# Sanitizer reports name files and lines only through a symbolizer: llvm-symbolizer where
# clang has one (Debian ships it in the llvm package, which clang does not pull in), else
# binutils' addr2line, which the sanitizers also drive.
file(REAL_PATH "${KOMPRESS_FUZZ_CXX}" fuzz_cxx_real)
get_filename_component(fuzz_cxx_dir "${fuzz_cxx_real}" DIRECTORY)
find_program(KOMPRESS_FUZZ_SYMBOLIZER
  NAMES llvm-symbolizer llvm-symbolizer-22 llvm-symbolizer-21 llvm-symbolizer-20 llvm-symbolizer-19
        llvm-symbolizer-18 addr2line
  HINTS "${fuzz_cxx_dir}"
  DOC "Symbolizer for the fuzzer's sanitizer reports (llvm-symbolizer or addr2line)")
set(fuzz_sanitizer_options "")
if(KOMPRESS_FUZZ_SYMBOLIZER)
  set(fuzz_sanitizer_options "external_symbolizer_path=${KOMPRESS_FUZZ_SYMBOLIZER}")
else()
  message(WARNING "kompress: neither llvm-symbolizer nor addr2line found; the fuzzer's sanitizer "
                  "reports will show addresses only")
endif()

# One thread (the fuzzer sets it too); a UBSan report prints its stack before aborting.
kompress_test_environment(fuzz_environment 1)
list(FILTER fuzz_environment EXCLUDE REGEX "^(OMP_NUM_THREADS|ASAN_OPTIONS|UBSAN_OPTIONS)=")
list(APPEND fuzz_environment "OMP_NUM_THREADS=1" "ASAN_OPTIONS=${fuzz_sanitizer_options}"
     "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:${fuzz_sanitizer_options}")

math(EXPR fuzz_timeout "${KOMPRESS_FUZZ_SECONDS} + 120")
set_tests_properties(fuzz.seeds PROPERTIES
  LABELS fuzz FIXTURES_SETUP kompress_fuzz_corpus TIMEOUT 120 ENVIRONMENT "${fuzz_environment}")
set_tests_properties(fuzz.build PROPERTIES
  LABELS fuzz FIXTURES_SETUP kompress_fuzzer TIMEOUT 900)
set_tests_properties(fuzz.decompress PROPERTIES
  LABELS fuzz FIXTURES_REQUIRED "kompress_fuzz_corpus;kompress_fuzzer"
  TIMEOUT ${fuzz_timeout} ENVIRONMENT "${fuzz_environment}")
