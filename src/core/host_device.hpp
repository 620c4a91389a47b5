// Marks functions that both the host compiler and nvcc compile for device code, so the wire
// formats, window layout and routing arithmetic have one definition for every backend.
#pragma once

#if defined(__CUDACC__)
#define UBEP_HD __host__ __device__
#else
#define UBEP_HD
#endif
