# Every header under include/kompress compiles on its own, included twice (the guard holds):
# one translation unit per header, built by the ctest test `headers_self_contained` (not by
# the default build, which stays quick to iterate on). Headers that need MPI are checked
# against kompress::mpi, the others against kompress::kompress alone, so a codec header that
# started to need MPI would fail here.
file(GLOB_RECURSE kompress_public_headers CONFIGURE_DEPENDS
     RELATIVE "${PROJECT_SOURCE_DIR}/include" "${PROJECT_SOURCE_DIR}/include/kompress/*.hpp")

set(header_sources "")
set(mpi_header_sources "")
foreach(header IN LISTS kompress_public_headers)
  string(MAKE_C_IDENTIFIER "${header}" name)
  set(source "${CMAKE_CURRENT_BINARY_DIR}/headers/${name}.cpp")
  file(CONFIGURE OUTPUT "${source}" CONTENT "#include <${header}>\n#include <${header}>\n")
  if(header MATCHES "^kompress/(comm|dlrm)(/|\\.hpp)|^kompress/detail/mpi\\.hpp$")
    list(APPEND mpi_header_sources "${source}")
  else()
    list(APPEND header_sources "${source}")
  endif()
endforeach()

# fwd.hpp's declarations agree with the definitions (an enum's underlying type, a class key).
set(source "${CMAKE_CURRENT_BINARY_DIR}/headers/fwd_then_definitions.cpp")
file(CONFIGURE OUTPUT "${source}" CONTENT
     "#include <kompress/fwd.hpp>\n#include <kompress/kompress.hpp>\n#include <kompress/dlrm.hpp>\n")
list(APPEND mpi_header_sources "${source}")

add_library(kompress_header_check OBJECT EXCLUDE_FROM_ALL ${header_sources})
target_link_libraries(kompress_header_check PRIVATE kompress::kompress)
kompress_target_defaults(kompress_header_check)
set(header_targets kompress_header_check)
if(TARGET kompress::mpi)
  add_library(kompress_mpi_header_check OBJECT EXCLUDE_FROM_ALL ${mpi_header_sources})
  target_link_libraries(kompress_mpi_header_check PRIVATE kompress::mpi)
  kompress_target_defaults(kompress_mpi_header_check)
  list(APPEND header_targets kompress_mpi_header_check)
endif()

add_test(NAME headers_self_contained
  COMMAND "${CMAKE_COMMAND}" --build "${CMAKE_BINARY_DIR}" --target ${header_targets})
set_tests_properties(headers_self_contained PROPERTIES LABELS "build" TIMEOUT 900)

add_test(NAME headers_namespaces
  COMMAND "${CMAKE_COMMAND}" "-DINCLUDE_DIR=${PROJECT_SOURCE_DIR}/include" -P "${CMAKE_CURRENT_LIST_DIR}/namespaces.cmake")
set_tests_properties(headers_namespaces PROPERTIES LABELS "build")
