# The Python package's pytest suite under ctest (label "python"). Included by
# python/CMakeLists.txt in the top-level build with KOMPRESS_ENABLE_PYTHON=ON.
if(DEFINED ENV{KOMPRESS_DATA_DIR} AND NOT "$ENV{KOMPRESS_DATA_DIR}" STREQUAL "")
  set(kompress_python_data_default "$ENV{KOMPRESS_DATA_DIR}")
elseif(IS_DIRECTORY "${PROJECT_SOURCE_DIR}/../shared/data")
  cmake_path(SET kompress_python_data_default NORMALIZE "${PROJECT_SOURCE_DIR}/../shared/data")
else()
  set(kompress_python_data_default "${PROJECT_SOURCE_DIR}/data")  # the repository's sample (data/README.md)
endif()
set(KOMPRESS_DATA_DIR "${kompress_python_data_default}" CACHE PATH "Folder of the real test data")

set(tests_dir "${CMAKE_CURRENT_SOURCE_DIR}/tests")
# One thread each for torch, OpenBLAS and Kokkos: the tests run two at a time, and MPI ones put
# up to four ranks on the machine. As root (the dev root, CI containers) Open MPI needs the two ALLOW
# variables; --oversubscribe lets 4 ranks run on fewer cores.
set(kompress_python_env
  "PYTHONPATH=${CMAKE_CURRENT_BINARY_DIR}/package"
  "KOMPRESS_DATA_DIR=${KOMPRESS_DATA_DIR}"
  "KOMPRESS_STREAM_TOOL=$<TARGET_FILE:kompress_stream_tool>"
  "OMP_NUM_THREADS=1" "OPENBLAS_NUM_THREADS=1" "OMP_PROC_BIND=false" "GLOO_SOCKET_IFNAME=lo"
  "OMPI_ALLOW_RUN_AS_ROOT=1" "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
  "OMPI_MCA_rmaps_base_oversubscribe=1" "PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe")
set(pytest ${Python_EXECUTABLE} -m pytest -q -rs -p no:cacheprovider)

# The same environment on the repository's sample (data/README.md): what a clone without the
# full set runs. Only where the build reads another folder, so the sample path is guarded in CI.
set(kompress_python_sample_env "${kompress_python_env}")
list(TRANSFORM kompress_python_sample_env REPLACE "^KOMPRESS_DATA_DIR=.*$"
     "KOMPRESS_DATA_DIR=${PROJECT_SOURCE_DIR}/data")
cmake_path(COMPARE "${KOMPRESS_DATA_DIR}" NOT_EQUAL "${PROJECT_SOURCE_DIR}/data" kompress_python_sample_pass)

# kompress_python_test(<name> <file> [RANKS <n>...] [LABELS <label>...] [TIMEOUT <s>] [SAMPLE])
# registers python.<name> (or python.<name>.np<N> per rank count); SAMPLE adds
# python.sample.<name> (on two ranks where RANKS has 2), the file run on the repository's sample.
function(kompress_python_test name file)
  cmake_parse_arguments(PARSE_ARGV 2 arg "SAMPLE" "TIMEOUT" "RANKS;LABELS")
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 120)
  endif()
  if(arg_SAMPLE AND kompress_python_sample_pass)
    set(test python.sample.${name})
    if(2 IN_LIST arg_RANKS)
      add_test(NAME ${test}
        COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
                ${pytest} -x "${tests_dir}/${file}" ${MPIEXEC_POSTFLAGS})
      set_tests_properties(${test} PROPERTIES PROCESSORS 2 LABELS "python;mpi;sample")
    else()
      add_test(NAME ${test} COMMAND ${pytest} "${tests_dir}/${file}")
      set_tests_properties(${test} PROPERTIES LABELS "python;sample")
    endif()
    set_tests_properties(${test} PROPERTIES ENVIRONMENT "${kompress_python_sample_env}" TIMEOUT ${arg_TIMEOUT})
  endif()
  if(NOT arg_RANKS)
    add_test(NAME python.${name} COMMAND ${pytest} "${tests_dir}/${file}")
    set_tests_properties(python.${name} PROPERTIES ENVIRONMENT "${kompress_python_env}"
      LABELS "python;${arg_LABELS}" TIMEOUT ${arg_TIMEOUT})
    return()
  endif()
  foreach(ranks IN LISTS arg_RANKS)
    set(test python.${name}.np${ranks})
    add_test(NAME ${test}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPIEXEC_PREFLAGS}
              ${pytest} -x "${tests_dir}/${file}" ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${test} PROPERTIES ENVIRONMENT "${kompress_python_env}"
      LABELS "python;mpi;${arg_LABELS}" PROCESSORS ${ranks} TIMEOUT ${arg_TIMEOUT})
  endforeach()
endfunction()

kompress_python_test(codec test_codec.py SAMPLE)
kompress_python_test(errors test_errors.py)
kompress_python_test(collectives test_collectives.py RANKS 1 2 4 SAMPLE)
kompress_python_test(persistent test_persistent.py RANKS 1 2 4 SAMPLE)
# A bad argument on one rank: an error on every rank, and the next call matches (the agreement
# of a pair, and of every pair on three and four ranks).
kompress_python_test(one_rank_bad test_one_rank_bad.py RANKS 2 3 4)
kompress_python_test(dlrm test_dlrm.py RANKS 1 2 4 SAMPLE)
kompress_python_test(ddp test_ddp.py RANKS 2 SAMPLE)
# The DDP hook on gloo process groups of 1, 2 and 4 ranks (torch.multiprocessing, no MPI). No
# sample rerun: it spends its half minute starting process groups, and the reruns above already
# show that the sample serves conftest's loaders.
kompress_python_test(process_group test_process_group.py TIMEOUT 600)
set_tests_properties(python.process_group PROPERTIES PROCESSORS 2)
kompress_python_test(stash test_stash.py SAMPLE)
kompress_python_test(saved_tensors test_saved_tensors.py TIMEOUT 300 SAMPLE)
kompress_python_test(layer_bounds test_layer_bounds.py)
# Which devices the package takes; the CUDA tensor tests run where a CUDA build meets a GPU.
kompress_python_test(devices test_devices.py TIMEOUT 600 SAMPLE)

# README's Python install, as written (python/tests/install_check.sh): a virtual environment
# at the repository root (.venv, ignored by git, reused by the next run), the package built
# into it by pip, then imported from there.
add_test(NAME python.install COMMAND "${tests_dir}/install_check.sh" "${PROJECT_SOURCE_DIR}")
set_tests_properties(python.install PROPERTIES ENVIRONMENT "${kompress_python_env}" LABELS "python;install"
  TIMEOUT 900 RUN_SERIAL ON)

# The examples of docs/python.md (python/examples/), run as they are: one per use.
set(examples_dir "${CMAKE_CURRENT_SOURCE_DIR}/examples")
function(kompress_python_example name ranks)
  set(test python.example.${name})
  if(ranks GREATER 0)
    add_test(NAME ${test} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${MPIEXEC_PREFLAGS}
                                  ${Python_EXECUTABLE} "${examples_dir}/${name}.py" ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${test} PROPERTIES PROCESSORS ${ranks})
  else()
    add_test(NAME ${test} COMMAND ${Python_EXECUTABLE} "${examples_dir}/${name}.py")
  endif()
  set_tests_properties(${test} PROPERTIES ENVIRONMENT "${kompress_python_env}"
    LABELS "python;example" TIMEOUT 120)
endfunction()
kompress_python_example(codec 0)
kompress_python_example(collectives 2)
kompress_python_example(ddp_hook 2)
kompress_python_example(saved_activations 0)
kompress_python_example(dlrm_exchange 2)

# The DLRM training comparison of docs/dlrm.md, shortened: 2 ranks, 300 iterations of global
# batch 256 (27% of a pass), plain fp32 against kompress at the recommended bounds from the
# same weights and batch order, both scored on the first 8192 held-out rows. The program exits 1 (and
# the test fails) if kompress's held-out AUC is more than 0.005 below plain's.
add_test(NAME python.dlrm_training.np2
  COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${MPIEXEC_PREFLAGS}
          ${Python_EXECUTABLE} "${examples_dir}/dlrm_training.py" --variants plain,kompress
          --iterations 300 --batch 256 --eval-rows 8192 --eval-every 0 --check-every 50 --max-auc-drop 0.005
          ${MPIEXEC_POSTFLAGS})
# DDP on gloo, the MNIST MLP, shortened: plain allreduce against kompress's hook, 2 ranks started
# by the program; fails where kompress's final loss is more than 1% above plain's.
add_test(NAME python.ddp_training
  COMMAND ${Python_EXECUTABLE} "${examples_dir}/ddp_training.py" --ranks 2 --variants plain,kompress --steps 40
          --warmup 2 --max-loss-gap 0.01)
set_tests_properties(python.ddp_training PROPERTIES ENVIRONMENT "${kompress_python_env}" SKIP_RETURN_CODE 77
  LABELS "python;example" PROCESSORS 2 TIMEOUT 300)
set_tests_properties(python.dlrm_training.np2 PROPERTIES ENVIRONMENT "${kompress_python_env}" SKIP_RETURN_CODE 77
  LABELS "python;mpi;example" PROCESSORS 2 TIMEOUT 300)
# Saved activations in training (docs/performance.md), shortened: the MLP, the CNN and the
# transformer block, one epoch on 1,024 images, each plain, through kompress's hooks (REL 5e-2,
# stochastic rounding; and with per-layer bounds up to 2e-1), as fp16 casts and as ActNN-style
# codes (2 bits, and 10 steps of each group's range in 4 bits); fails where kompress's final
# loss is more than 1% above plain's.
add_test(NAME python.activation_training
  COMMAND ${Python_EXECUTABLE} "${examples_dir}/activation_training.py" --quick --max-loss-gap 0.01
          --variants plain,kompress,layers@5e-2/2e-1,fp16,actnn2,actnn@10)
set_tests_properties(python.activation_training PROPERTIES ENVIRONMENT "${kompress_python_env}"
  SKIP_RETURN_CODE 77 LABELS "python;example" TIMEOUT 300)
# The MLP in a budget of an eleventh of plain's saved bytes (the stash's loosen_bound policy: a
# save that does not fit is stored within a looser bound; a few do here), the ratio codec.
add_test(NAME python.activation_training.budget
  COMMAND ${Python_EXECUTABLE} "${examples_dir}/activation_training.py" --quick --max-loss-gap 0.01
          --models mlp --no-input-sign --codec ratio --variants plain,budget@8e-2/11)
set_tests_properties(python.activation_training.budget PROPERTIES ENVIRONMENT "${kompress_python_env}"
  SKIP_RETURN_CODE 77 LABELS "python;example" TIMEOUT 300)
