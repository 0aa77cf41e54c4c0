# FindOpenMP for the fuzz project only: tests/fuzz/CMakeLists.txt puts this folder first on
# CMAKE_MODULE_PATH, so it shadows CMake's module there and nowhere else.
#
# Why: Kokkos's package config calls find_dependency(OpenMP) and links OpenMP::OpenMP_CXX.
# Debian's Kokkos was built by g++ against GCC's OpenMP runtime, libgomp. The dev root's clang
# has no OpenMP runtime of its own (no libomp, not even an omp.h), and what clang -fopenmp
# generates calls __kmpc_* entry points that libgomp does not provide, so the fuzzer cannot be
# built with real OpenMP. Instead OpenMP::OpenMP_CXX gives clang GCC's omp.h and libgomp and
# defines _OPENMP without -fopenmp: Kokkos's headers compile, their `#pragma omp` regions
# become serial code (-Wno-source-uses-openmp), and libkokkoscore keeps the runtime it was
# built with. That is only correct while Kokkos runs one host thread, which fuzz_decompress.cpp
# sets and checks at start-up.
#
# Cache variables (found from the compiler's GCC installation, or set them):
#   KOMPRESS_FUZZ_GOMP_LIBRARY   GCC's libgomp.so
#   KOMPRESS_FUZZ_OMP_H          GCC's omp.h (copied alone into the build tree: adding GCC's
#                                whole include folder would shadow clang's own intrinsics)
include(FindPackageHandleStandardArgs)

if(NOT KOMPRESS_FUZZ_GOMP_LIBRARY)
  # clang knows the GCC installation it uses; libgomp.so sits in it.
  execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libgomp.so
                  OUTPUT_VARIABLE gomp_library OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE gomp_result)
  if(gomp_result EQUAL 0 AND IS_ABSOLUTE "${gomp_library}" AND EXISTS "${gomp_library}")
    set(KOMPRESS_FUZZ_GOMP_LIBRARY "${gomp_library}" CACHE FILEPATH "GCC's libgomp.so, for Kokkos's OpenMP backend in the fuzzer")
  endif()
endif()
if(NOT KOMPRESS_FUZZ_OMP_H AND KOMPRESS_FUZZ_GOMP_LIBRARY)
  get_filename_component(gomp_dir "${KOMPRESS_FUZZ_GOMP_LIBRARY}" DIRECTORY)
  if(EXISTS "${gomp_dir}/include/omp.h")
    set(KOMPRESS_FUZZ_OMP_H "${gomp_dir}/include/omp.h" CACHE FILEPATH "GCC's omp.h, for Kokkos's OpenMP headers in the fuzzer")
  endif()
endif()

set(OpenMP_CXX_FOUND FALSE)
if(KOMPRESS_FUZZ_GOMP_LIBRARY AND KOMPRESS_FUZZ_OMP_H)
  set(OpenMP_CXX_FOUND TRUE)
endif()
find_package_handle_standard_args(OpenMP
  REQUIRED_VARS KOMPRESS_FUZZ_GOMP_LIBRARY KOMPRESS_FUZZ_OMP_H
  HANDLE_COMPONENTS
  REASON_FAILURE_MESSAGE "the fuzzer needs GCC's libgomp.so and omp.h (the OpenMP runtime Debian's Kokkos was built with): install g++, or set KOMPRESS_FUZZ_GOMP_LIBRARY and KOMPRESS_FUZZ_OMP_H")

if(OpenMP_FOUND AND NOT TARGET OpenMP::OpenMP_CXX)
  set(omp_include "${CMAKE_BINARY_DIR}/gomp_include")
  configure_file("${KOMPRESS_FUZZ_OMP_H}" "${omp_include}/omp.h" COPYONLY)
  add_library(OpenMP::OpenMP_CXX INTERFACE IMPORTED)
  # An imported target's include folders are system ones: GCC-only attributes in omp.h warn
  # nowhere. 201511 (OpenMP 4.5) is the level Kokkos's headers test _OPENMP against.
  set_target_properties(OpenMP::OpenMP_CXX PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${omp_include}"
    INTERFACE_COMPILE_DEFINITIONS "_OPENMP=201511"
    INTERFACE_COMPILE_OPTIONS "-Wno-source-uses-openmp"
    INTERFACE_LINK_LIBRARIES "${KOMPRESS_FUZZ_GOMP_LIBRARY}")
endif()
