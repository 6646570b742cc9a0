#include "engine/backends/cuda/graph.h"

#include <cudnn.h>

#include <utility>

#include "engine/backends/cuda/check.h"
#include "engine/core/log.h"

namespace latent::cuda {

CudaGraph::CudaGraph(std::shared_ptr<DeviceContext> ctx, cudaGraph_t graph, cudaGraphExec_t exec,
                     std::shared_ptr<Storage> arena)
    : ctx_(std::move(ctx)), graph_(graph), exec_(exec), arena_(std::move(arena)) {
  size_t n = 0;
  if (cudaGraphGetNodes(graph_, nullptr, &n) == cudaSuccess) nodes_ = n;
  (void)cudaGetLastError();
}

CudaGraph::~CudaGraph() {
  DeviceGuard guard;
  if (!guard.set(ctx_->device()).ok()) return;
  // A replay may still be queued; plans are dropped at renegotiation, not per frame.
  LATENT_CUDA_WARN(cudaStreamSynchronize(ctx_->stream()));
  if (exec_) LATENT_CUDA_WARN(cudaGraphExecDestroy(exec_));
  if (graph_) LATENT_CUDA_WARN(cudaGraphDestroy(graph_));
}

Status CudaGraph::launch() const {
  LATENT_CUDA_CHECK(cudaGraphLaunch(exec_, ctx_->stream()));
  return ok_status();
}

Status begin_stream_capture(DeviceContext& ctx) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  LATENT_CUDA_CHECK(cudaStreamIsCapturing(ctx.stream(), &status));
  if (status != cudaStreamCaptureStatusNone)
    return Status::errorf(ctx.label(), ": the stream is already being captured");
  LATENT_CUDA_CHECK(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal));
  return ok_status();
}

Result<std::shared_ptr<CudaGraph>> end_stream_capture(std::shared_ptr<DeviceContext> ctx,
                                                      std::shared_ptr<Storage> arena) {
  cudaGraph_t graph = nullptr;
  const cudaError_t rc = cudaStreamEndCapture(ctx->stream(), &graph);
  if (rc != cudaSuccess || !graph) {
    (void)cudaGetLastError();
    if (graph) (void)cudaGraphDestroy(graph);
    return Status::errorf(ctx->label(), ": graph capture failed: ", cudaGetErrorString(rc),
                          " (an op synchronised, allocated outside the pool or was not run "
                          "once before the capture)");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ri = cudaGraphInstantiate(&exec, graph, 0);
  if (ri != cudaSuccess) {
    (void)cudaGetLastError();
    (void)cudaGraphDestroy(graph);
    return Status::errorf(ctx->label(), ": cudaGraphInstantiate failed: ", cudaGetErrorString(ri));
  }
  return std::make_shared<CudaGraph>(std::move(ctx), graph, exec, std::move(arena));
}

namespace {
int64_t graph_attribute(int device, cudaGraphMemAttributeType attr) {
  uint64_t v = 0;
  if (cudaDeviceGetGraphMemAttribute(device, attr, &v) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return static_cast<int64_t>(v);
}
}  // namespace

int64_t graph_memory_high(int device) {
  return graph_attribute(device, cudaGraphMemAttrUsedMemHigh);
}

int64_t graph_memory_used(int device) {
  return graph_attribute(device, cudaGraphMemAttrUsedMemCurrent);
}

int64_t graph_memory_reserved(int device) {
  return graph_attribute(device, cudaGraphMemAttrReservedMemCurrent);
}

void reset_graph_memory_high(int device) {
  uint64_t zero = 0;
  LATENT_CUDA_WARN(cudaDeviceSetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &zero));
}

std::shared_ptr<PlanCache> open_plan_cache(const DeviceContext& ctx) {
  const cudaDeviceProp& p = ctx.properties();
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) (void)cudaGetLastError();
  PlanCache::Context context = {
      {"gpu", p.name},
      {"compute_capability", str_cat(p.major, ".", p.minor)},
      {"cudnn", str_cat(cudnnGetVersion())},
      {"cudart", str_cat(runtime)},
  };
  auto cache = std::make_shared<PlanCache>(
      PlanCache::file_for(PlanCache::default_directory(), "cuda-plans", context), context);
  const size_t n = cache->load();
  if (!cache->path().empty())
    LATENT_DEBUG(ctx.label(), ": plan cache ", cache->path(), " (", n, " entries)");
  return cache;
}

}  // namespace latent::cuda
