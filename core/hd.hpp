// Marks functions shared by the CPU engine and the CUDA kernels.
#pragma once
#if defined(__CUDACC__)
#define LOWBIT_HD __host__ __device__ __forceinline__
#else
#define LOWBIT_HD inline
#endif
