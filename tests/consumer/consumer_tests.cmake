# The consumer tests ({fmt}'s find-package-test habit): at ctest time, build tests/consumer
# against this build of kompress the ways users do. Labeled "consumer".
#
#   consumer.install                    cmake --install this build into
#                                       <build>/consumer/prefix (the find_package fixture)
#   consumer.find_package               find_package(kompress COMPONENTS mpi) from that prefix
#                                       (without the component when MPI was not found)
#   consumer.find_package_implicit_mpi  find_package(kompress): kompress::mpi comes along
#   consumer.find_package_no_mpi        find_package(kompress), codec only, MPI made unfindable
#   consumer.mpi_component_no_mpi       COMPONENTS mpi, MPI made unfindable: a clear error
#   consumer.build_tree                 find_package(kompress) with kompress_DIR=<this build>
#                                       (the build-tree export)
#   consumer.add_subdirectory           add_subdirectory(<kompress source>) [+ kompress::mpi]
#   consumer.add_subdirectory_no_mpi    the same, codec only, MPI made unfindable
set(consumer_root "${PROJECT_BINARY_DIR}/consumer")
set(consumer_script "${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake")
set(consumer_common
  "-DCONSUMER_DIR=${CMAKE_CURRENT_LIST_DIR}"
  "-DGENERATOR=${CMAKE_GENERATOR}"
  "-DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}"
  "-DCXX_COMPILER=${CMAKE_CXX_COMPILER}"
  "-DBUILD_TYPE=$<CONFIG>"
  "-DKOMPRESS_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
  "-DPREFIX=${consumer_root}/prefix"
  "-DMPIEXEC=${MPIEXEC_EXECUTABLE}"
  "-DMPIEXEC_NUMPROC_FLAG=${MPIEXEC_NUMPROC_FLAG}")
if(Kokkos_DIR)
  list(APPEND consumer_common "-DKOKKOS_DIR=${Kokkos_DIR}")
endif()
set(consumer_with_mpi)
if(TARGET kompress::mpi)
  set(consumer_with_mpi -DWITH_MPI=ON)
endif()

add_test(NAME consumer.install
  COMMAND "${CMAKE_COMMAND}" -DSTEP=install "-DBUILD_DIR=${PROJECT_BINARY_DIR}"
          "-DPREFIX=${consumer_root}/prefix" "-DCONFIG=$<CONFIG>" -P "${consumer_script}")
set_tests_properties(consumer.install PROPERTIES FIXTURES_SETUP kompress_install)

function(kompress_consumer_test name)
  add_test(NAME consumer.${name}
    COMMAND "${CMAKE_COMMAND}" -DSTEP=consumer ${consumer_common}
            "-DWORK_DIR=${consumer_root}/${name}" ${ARGN} -P "${consumer_script}")
endfunction()
kompress_consumer_test(find_package -DMODE=find_package ${consumer_with_mpi})
kompress_consumer_test(find_package_no_mpi -DMODE=find_package -DNO_MPI=ON)
kompress_consumer_test(build_tree -DMODE=find_package "-DKOMPRESS_DIR=${PROJECT_BINARY_DIR}")
kompress_consumer_test(add_subdirectory -DMODE=add_subdirectory ${consumer_with_mpi})
kompress_consumer_test(add_subdirectory_no_mpi -DMODE=add_subdirectory -DNO_MPI=ON)
set_tests_properties(consumer.find_package consumer.find_package_no_mpi
  PROPERTIES FIXTURES_REQUIRED kompress_install)
set(consumer_tests consumer.install consumer.find_package consumer.find_package_no_mpi
                   consumer.build_tree consumer.add_subdirectory consumer.add_subdirectory_no_mpi)
if(TARGET kompress::mpi)
  kompress_consumer_test(find_package_implicit_mpi -DMODE=find_package -DWITH_MPI=ON
    -DIMPLICIT_MPI=ON)
  kompress_consumer_test(mpi_component_no_mpi -DMODE=find_package -DWITH_MPI=ON -DNO_MPI=ON
    "-DEXPECT_CONFIGURE_ERROR=kompress could not be found because dependency MPI could not be found")
  set_tests_properties(consumer.find_package_implicit_mpi consumer.mpi_component_no_mpi
    PROPERTIES FIXTURES_REQUIRED kompress_install)
  list(APPEND consumer_tests consumer.find_package_implicit_mpi consumer.mpi_component_no_mpi)
endif()

kompress_test_environment(consumer_environment 2)
set_tests_properties(${consumer_tests} PROPERTIES
  LABELS consumer TIMEOUT 600 ENVIRONMENT "${consumer_environment}")
