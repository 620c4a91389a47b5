# cmake -DPTX=<kernels.ptx> -P check_ptx.cmake: properties of the CUDA kernels that hold without
# running them, checked in the PTX nvcc generated (see src/backend/cuda/CMakeLists.txt).
if(NOT EXISTS "${PTX}")
  message(FATAL_ERROR "no PTX at ${PTX}")
endif()
file(READ "${PTX}" ptx)
set(failed "")
# Bit-identical combine: products and sums rounded separately, never fused.
foreach(bad "fma.rn.f32" "fma.f32" "mad.f32" "mad.rn.f32")
  string(FIND "${ptx}" "${bad}" at)
  if(NOT at EQUAL -1)
    list(APPEND failed "found ${bad}: the fixed-order sum must not be contracted")
  endif()
endforeach()
foreach(need "mul.rn.f32" "add.rn.f32"
             "st.release.sys.global.u32" "ld.acquire.sys.global.u32"
             "st.release.gpu.global.u32" "ld.acquire.gpu.global.u32"
             ".entry _ZN4ubep8cuda_dev15dispatch_kernelINS0_12VirtualPeersEEEvNS_7cuda_hd12LaunchParamsE"
             ".entry _ZN4ubep8cuda_dev14combine_kernelINS0_8IpcPeersEEEvNS_7cuda_hd12LaunchParamsE")
  string(FIND "${ptx}" "${need}" at)
  if(at EQUAL -1)
    list(APPEND failed "missing ${need}")
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "PTX check failed:\n  ${failed}")
endif()
message(STATUS "PTX check passed: no fused multiply-add, release/acquire tags at sys and gpu scope")
