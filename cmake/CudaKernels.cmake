# lowbit_cuda_kernels(<name> <sources>...): an object library of CUDA
# kernels with the flags every lowbit kernel is built with:
#   --fmad=false  no FMA contraction, so the per-element math rounds exactly as
#                 the CPU engine's (bit-identical results);
#   IEEE division and square root (the nvcc default; never --use_fast_math),
# unless LOWBIT_CUDA_FAST_MATH (benchmarks only, cuda/CMakeLists.txt).
function(lowbit_cuda_kernels name)
  add_library(${name} OBJECT ${ARGN})
  set_target_properties(${name} PROPERTIES
    CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
    POSITION_INDEPENDENT_CODE ON
    CUDA_VISIBILITY_PRESET hidden
    CUDA_RUNTIME_LIBRARY Static)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/capi ${LOWBIT_GENERATED_INCLUDE_DIR})
  if(LOWBIT_CUDA_FAST_MATH)
    target_compile_options(${name} PRIVATE --use_fast_math -Xcompiler=-Wall)
  else()
    target_compile_options(${name} PRIVATE --fmad=false -Xcompiler=-Wall)
  endif()
  if(LOWBIT_CUDA_PTXAS_VERBOSE)
    target_compile_options(${name} PRIVATE -Xptxas=-v)
  endif()
endfunction()
