// CUDA graphs and the on-disk plan cache of the CUDA backend.
//
// Capture: the backend's stream is captured in cudaStreamCaptureModeThreadLocal (other threads
// may keep using CUDA; this thread may not call anything that synchronises). Where the same
// run was recorded just before (Backend::record_allocations, as plans do), the captured ops'
// buffers come from one arena laid out by their recorded lifetimes (DeviceContext's planned
// allocations; cuDNN's workspaces are buffers of their calls too), which the CudaGraph owns.
// Otherwise buffers the captured ops allocate from the backend's pool (cudaMallocFromPoolAsync)
// become graph memory nodes and the frees free nodes: the driver gives the graph its own memory and
// lays it out itself (for the TAESD-size decoder at 1080p, 32 % more than the plain run's working
// set), and all of it is freed inside the graph, so the graph can be relaunched at once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "engine/backends/backend.h"
#include "engine/backends/cuda/memory.h"
#include "engine/core/plan_cache.h"

namespace latent::cuda {

class CudaGraph final : public CapturedGraph {
 public:
  CudaGraph(std::shared_ptr<DeviceContext> ctx, cudaGraph_t graph, cudaGraphExec_t exec,
            std::shared_ptr<Storage> arena);
  ~CudaGraph() override;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Queues one replay on the context's stream (the caller makes the device current).
  Status launch() const;
  const DeviceContext* context() const { return ctx_.get(); }
  size_t nodes() const { return nodes_; }

 private:
  std::shared_ptr<DeviceContext> ctx_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  std::shared_ptr<Storage> arena_;  // the planned buffers (null: graph memory)
  size_t nodes_ = 0;
};

// Starts capturing ctx.stream() for the calling thread.
Status begin_stream_capture(DeviceContext& ctx);
// Ends the capture of ctx.stream() and instantiates it; `arena` (the planned buffers, may be
// null) is kept by the graph.
// Fails (after ending the capture) when the capture was invalidated by a forbidden call.
Result<std::shared_ptr<CudaGraph>> end_stream_capture(std::shared_ptr<DeviceContext> ctx,
                                                      std::shared_ptr<Storage> arena);

// Most device memory graphs held at once on `device` since the last reset (graph memory nodes
// are not in the backend's pool), and its reset; 0 where unknown.
int64_t graph_memory_high(int device);
// Bytes of graph memory (allocations made inside captured graphs) on `device`: in use by
// instantiated graphs now / reserved from the driver now (0 on failure).
int64_t graph_memory_used(int device);
int64_t graph_memory_reserved(int device);
void reset_graph_memory_high(int device);

// The plan cache file for this device, named and checked by GPU name, compute capability,
// cuDNN and CUDA runtime versions (PlanCache::default_directory(); in memory only when that is
// empty), already loaded.
std::shared_ptr<PlanCache> open_plan_cache(const DeviceContext& ctx);

}  // namespace latent::cuda
