# Compiler settings for kompress's own programs (tests, examples, benchmarks), never for the
# interface targets users link: a user's build keeps its own flags.
#
#   kompress_target_warnings(<target>)    -Wall -Wextra -Wpedantic (+ -Werror unless
#                                         KOMPRESS_WARNINGS_AS_ERRORS is OFF)
#   kompress_target_sanitizers(<target>)  ASan + UBSan when KOMPRESS_SANITIZE is ON
#   kompress_target_defaults(<target>)    both; what every test/example/bench target calls
include_guard(GLOBAL)

function(kompress_target_warnings target)
  set(gnu_like "$<CXX_COMPILER_ID:GNU,Clang,AppleClang,IntelLLVM>")
  target_compile_options(${target} PRIVATE
    "$<${gnu_like}:-Wall;-Wextra;-Wpedantic>"
    "$<$<AND:${gnu_like},$<BOOL:${KOMPRESS_WARNINGS_AS_ERRORS}>>:-Werror>"
    "$<$<CXX_COMPILER_ID:MSVC>:/W4;$<$<BOOL:${KOMPRESS_WARNINGS_AS_ERRORS}>:/WX>>")
  # Through Kokkos's nvcc_wrapper (which reports the host compiler's id and drops -Wpedantic,
  # whose line-directive warnings nvcc's generated code cannot avoid), -Werror reaches only the
  # host compiler: nvcc's own diagnostics (a host function called from device code, say) become
  # errors with its all-warnings kind.
  if(Kokkos_ENABLE_CUDA AND KOMPRESS_WARNINGS_AS_ERRORS AND
     CMAKE_CXX_COMPILER MATCHES "nvcc_wrapper$")
    target_compile_options(${target} PRIVATE "-Werror=all-warnings")
  endif()
endfunction()

function(kompress_target_sanitizers target)
  if(NOT KOMPRESS_SANITIZE)
    return()
  endif()
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    message(FATAL_ERROR "kompress: KOMPRESS_SANITIZE needs GCC or Clang (got ${CMAKE_CXX_COMPILER_ID})")
  endif()
  # -fno-sanitize-recover: a UBSan finding fails the test instead of printing and going on.
  set(flags -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  target_compile_options(${target} PRIVATE ${flags})
  target_link_options(${target} PRIVATE ${flags})
endfunction()

function(kompress_target_defaults target)
  kompress_target_warnings(${target})
  kompress_target_sanitizers(${target})
endfunction()
