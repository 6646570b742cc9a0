// The one checking macro for CUDA runtime, cuDNN and cuBLASLt calls. On failure it logs the
// call, file and line through LATENT_ERROR and returns a failed Status from the enclosing
// function (which returns Status or Result<T>).
//
//   LATENT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream));
//   LATENT_CUDA_CHECK(cudnnConvolutionForward(...));
//
// LATENT_CUDA_WARN does the same but only logs (for destructors and other void paths).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "engine/core/log.h"
#include "engine/core/status.h"

namespace latent::cuda {

inline bool call_ok(cudaError_t e) { return e == cudaSuccess; }
inline bool call_ok(cudnnStatus_t e) { return e == CUDNN_STATUS_SUCCESS; }
inline bool call_ok(cublasStatus_t e) { return e == CUBLAS_STATUS_SUCCESS; }

inline const char* call_error(cudaError_t e) { return cudaGetErrorString(e); }
inline const char* call_error(cudnnStatus_t e) { return cudnnGetErrorString(e); }
inline const char* call_error(cublasStatus_t e) {
  switch (e) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "cuBLAS error";
  }
}

// Clears a runtime error so that a reported, non-sticky failure does not resurface at the next
// cudaGetLastError (sticky errors stay; they poison the context anyway).
inline void clear_error(cudaError_t) { (void)cudaGetLastError(); }
inline void clear_error(cudnnStatus_t) {}
inline void clear_error(cublasStatus_t) {}

}  // namespace latent::cuda

#define LATENT_CUDA_CHECK(call)                                                                  \
  do {                                                                                           \
    const auto latent_cuda_rc_ = (call);                                                         \
    if (!::latent::cuda::call_ok(latent_cuda_rc_)) {                                             \
      const char* latent_cuda_err_ = ::latent::cuda::call_error(latent_cuda_rc_);                \
      ::latent::cuda::clear_error(latent_cuda_rc_);                                              \
      LATENT_ERROR(#call, " failed at ", __FILE__, ':', __LINE__, ": ", latent_cuda_err_);       \
      return ::latent::Status::errorf(#call, " failed: ", latent_cuda_err_, " (", __FILE__, ':', \
                                      __LINE__, ')');                                            \
    }                                                                                            \
  } while (0)

#define LATENT_CUDA_WARN(call)                                                            \
  do {                                                                                    \
    const auto latent_cuda_rc_ = (call);                                                  \
    if (!::latent::cuda::call_ok(latent_cuda_rc_)) {                                      \
      const char* latent_cuda_err_ = ::latent::cuda::call_error(latent_cuda_rc_);         \
      ::latent::cuda::clear_error(latent_cuda_rc_);                                       \
      LATENT_WARN(#call, " failed at ", __FILE__, ':', __LINE__, ": ", latent_cuda_err_); \
    }                                                                                     \
  } while (0)

// After a kernel launch: reports a bad launch configuration (or an earlier sticky error),
// naming the kernel.
#define LATENT_CUDA_CHECK_LAUNCH(what)                                                        \
  do {                                                                                        \
    const cudaError_t latent_cuda_rc_ = cudaGetLastError();                                   \
    if (latent_cuda_rc_ != cudaSuccess) {                                                     \
      LATENT_ERROR("launch of ", what, " failed at ", __FILE__, ':', __LINE__, ": ",          \
                   cudaGetErrorString(latent_cuda_rc_));                                      \
      return ::latent::Status::errorf("launch of ", what,                                     \
                                      " failed: ", cudaGetErrorString(latent_cuda_rc_), " (", \
                                      __FILE__, ':', __LINE__, ')');                          \
    }                                                                                         \
  } while (0)
