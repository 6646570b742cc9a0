// cuDNN SDPA for the DiT attention op (see sdpa.h), through cudnn-frontend (like conv_fused.cpp).
#include "engine/backends/cuda/sdpa.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/backends/cuda/attention_flash.cuh"
#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/fp8_quant.cuh"
#include "engine/backends/frames.h"
#include "engine/core/env.h"
#include "engine/core/log.h"

#ifdef LATENT_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>
#include <nvrtc.h>

#include "engine/backends/cuda/cudnn_graph.h"

// cudnn-frontend compiles in an experimental SM100 RMSNorm+SiLU engine that calls NVRTC; we never
// build it, and linking libnvrtc would make the whole engine (and the plugin) fail to load where
// the CUDA runtime has no NVRTC. Weak, hidden stand-ins that refuse satisfy the linker without
// being exported: a host application's own libnvrtc is never interposed by the plugin.
extern "C" {
__attribute__((weak, visibility("hidden"))) nvrtcResult nvrtcCreateProgram(nvrtcProgram*,
                                                                           const char*, const char*,
                                                                           int, const char* const*,
                                                                           const char* const*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
__attribute__((weak, visibility("hidden"))) nvrtcResult nvrtcDestroyProgram(nvrtcProgram*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
__attribute__((weak, visibility("hidden"))) nvrtcResult nvrtcCompileProgram(nvrtcProgram, int,
                                                                            const char* const*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
__attribute__((weak, visibility("hidden"))) nvrtcResult nvrtcGetCUBINSize(nvrtcProgram, size_t*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
__attribute__((weak, visibility("hidden"))) nvrtcResult nvrtcGetCUBIN(nvrtcProgram, char*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
__attribute__((weak, visibility("hidden"))) nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram,
                                                                               size_t*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
__attribute__((weak, visibility("hidden"))) nvrtcResult nvrtcGetProgramLog(nvrtcProgram, char*) {
  return NVRTC_ERROR_INTERNAL_ERROR;
}
}
#endif

namespace latent::cuda {
namespace {

std::atomic<int64_t> g_cudnn_calls{0};
std::atomic<int64_t> g_cudnn_padding_calls{0};
std::atomic<int64_t> g_cudnn_fp8_calls{0};
std::atomic<int64_t> g_fallback_calls{0};

// The graph variants: no mask, the key mask as an additive bias, cuDNN's padding mask (key
// lengths).
enum class MaskVariant { kNone, kBias, kPadding };

const char* variant_name(MaskVariant m) {
  switch (m) {
    case MaskVariant::kNone:
      return "no mask";
    case MaskVariant::kBias:
      return "key mask as bias";
    case MaskVariant::kPadding:
      return "key lengths as padding mask";
  }
  return "?";
}

struct ShapeKey {
  int64_t b = 0, tq = 0, tk = 0;
  int heads = 0;
  int64_t d = 0;
  DType dtype = DType::kBF16;
  MaskVariant mask = MaskVariant::kNone;
  int64_t out_ld = 0;  // elements between output rows; 0: heads * d
  bool fp8 = false;    // e4m3 q, k, v and output (sdpa_attention_fp8); dtype: the caller's

  bool operator<(const ShapeKey& o) const {
    return std::tie(b, tq, tk, heads, d, dtype, mask, out_ld, fp8) <
           std::tie(o.b, o.tq, o.tk, o.heads, o.d, o.dtype, o.mask, o.out_ld, o.fp8);
  }
};

// "bf16 q [1, 4224, 24 x 128] k [1, 4224], key mask as bias"
std::string describe(const ShapeKey& s) {
  return str_cat(s.fp8 ? "fp8 e4m3" : dtype_name(s.dtype), " q [", s.b, ", ", s.tq, ", ", s.heads,
                 " x ", s.d, "] k [", s.b, ", ", s.tk, "], ", variant_name(s.mask),
                 s.out_ld ? str_cat(", output rows ", s.out_ld, " apart") : std::string());
}

// What runs when the graph of `s` cannot: the bias graph after the padding one, else ours.
const char* instead(const ShapeKey& s) {
  if (s.fp8) return "running this shape's attention in the compute dtype";
  return s.mask == MaskVariant::kPadding ? "using the key-mask bias graph instead"
                                         : "using our attention kernel for this shape";
}

// Logs `message` at debug level the first time `path` is taken for `key`.
void log_path_once(const ShapeKey& key, const char* path, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::pair<ShapeKey, std::string>> seen;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!seen.emplace(key, path).second) return;
  }
  LATENT_DEBUG("attention ", describe(key), ": ", message);
}

bool fall_back(const ShapeKey& key, const std::string& why) {
  ++g_fallback_calls;
  log_path_once(key, "ours", str_cat("our kernel (", why, ")"));
  return false;
}

// LATENT_CUDNN_SDPA=0, LATENT_CUDNN_PADDING_MASK=0: switched off (read at every call: tests
// switch them)
bool env_off(const char* name) { return env_choice(name, {{"1"}, {"0"}}, 0) == 1; }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Elements between the bias rows of two batch rows: whole 16-byte vectors.
int64_t bias_stride(int64_t tk) { return (tk + 7) / 8 * 8; }

#ifdef LATENT_HAVE_CUDNN_FRONTEND
namespace fe = cudnn_frontend;

enum : int64_t {
  kUidQ = 1,
  kUidK,
  kUidV,
  kUidO,
  kUidBias,
  kUidSeqQ,
  kUidSeqKv,
  // the FP8 graph's scalars (fp8_quant.cuh, Fp8AttentionScalar)
  kUidDescaleQ,
  kUidDescaleK,
  kUidDescaleV,
  kUidDescaleS,
  kUidScaleS,
  kUidScaleO,
  kUidAmaxS,
  kUidAmaxO,
};

// Bytes from seq_len_q to seq_len_kv in one device block of key lengths (b int32 each).
int64_t lengths_offset(int64_t b) { return (b * 4 + 255) / 256 * 256; }

// Distinct key-length sets kept on the device per context; past that the bias graph runs.
constexpr size_t kMaxLengthSets = 64;

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN cannot run this shape
  int64_t workspace = 0;
};

// One device context's cuDNN handle and graphs.
struct SdpaState {
  std::weak_ptr<DeviceContext> owner;
  cudnnHandle_t handle = nullptr;
  std::map<ShapeKey, Plan> plans;
  // The padding graph's device lengths per (Tq, key lengths): one cudaMalloc block each holding
  // seq_len_q (Tq for every row) and, lengths_offset(b) bytes on, seq_len_kv. Kept for the
  // context's life, so graphs captured with them stay valid.
  std::map<std::pair<int64_t, std::vector<int32_t>>, void*> lengths;
  std::mutex mutex;  // held across build and execution (the handle is not thread-safe)

  ~SdpaState() {
    for (auto& entry : lengths) LATENT_CUDA_WARN(cudaFree(entry.second));
    plans.clear();  // execution plans before the handle they were built with
    if (handle) {
      // The context's stream may be gone already (its owner expired).
      LATENT_CUDA_WARN(cudnnSetStream(handle, nullptr));
      LATENT_CUDA_WARN(cudnnDestroy(handle));
    }
  }
};

// Leaked on purpose: at process exit the CUDA runtime may already be torn down when static
// destructors run, so the handles of contexts still alive then are never destroyed.
std::mutex g_states_mutex;
std::map<const DeviceContext*, std::shared_ptr<SdpaState>>& states() {
  static auto* m = new std::map<const DeviceContext*, std::shared_ptr<SdpaState>>();
  return *m;
}

Result<std::shared_ptr<SdpaState>> state_for(DeviceContext& ctx) {
  std::lock_guard<std::mutex> lock(g_states_mutex);
  auto& m = states();
  // Forget contexts that were destroyed (a new one may reuse the address).
  for (auto it = m.begin(); it != m.end();) {
    if (it->second->owner.expired())
      it = m.erase(it);
    else
      ++it;
  }
  auto it = m.find(&ctx);
  if (it != m.end()) return it->second;
  auto state = std::make_shared<SdpaState>();
  state->owner = ctx.weak_from_this();
  LATENT_CUDA_CHECK(cudnnCreate(&state->handle));
  LATENT_CUDA_CHECK(cudnnSetStream(state->handle, ctx.stream()));
  m[&ctx] = state;
  LATENT_DEBUG(ctx.label(), ": cuDNN SDPA enabled (cuDNN ", cudnnGetVersion(), ", cudnn-frontend ",
               CUDNN_FRONTEND_VERSION, ")");
  return state;
}

// Builds the graph for `s` with the key-mask bias broadcast as `bias_dim` / `bias_stride`.
// Empty string: built; else the step that failed and cuDNN's message.
std::string build_graph(cudnnHandle_t handle, const ShapeKey& s,
                        const std::vector<int64_t>& bias_dim,
                        const std::vector<int64_t>& bias_stride, Plan* plan) {
  const fe::DataType_t dt = s.fp8 ? fe::DataType_t::FP8_E4M3 : half_type(s.dtype);
  auto g = new_graph(dt);
  // Our [B, T, H*d] rows as (B, H, T, d) with BSHD strides.
  const int64_t hd = s.heads * s.d;
  auto tensor = [&](const char* name, int64_t uid, int64_t t) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_data_type(dt)
                         .set_dim({s.b, s.heads, t, s.d})
                         .set_stride({t * hd, s.d, hd, 1}));
  };
  auto q = tensor("Q", kUidQ, s.tq);
  auto k = tensor("K", kUidK, s.tk);
  auto v = tensor("V", kUidV, s.tk);
  fe::graph::SDPA_attributes options;
  options.set_name("dit_attention")
      .set_generate_stats(false)
      .set_attn_scale(1.f / std::sqrt(static_cast<float>(s.d)));
  if (s.mask == MaskVariant::kPadding) {
    auto seq_len = [&](const char* name, int64_t uid) {
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_data_type(fe::DataType_t::INT32)
                           .set_dim({s.b, 1, 1, 1})
                           .set_stride({1, 1, 1, 1}));
    };
    options.set_padding_mask(true)
        .set_seq_len_q(seq_len("seq_len_q", kUidSeqQ))
        .set_seq_len_kv(seq_len("seq_len_kv", kUidSeqKv));
  } else if (s.mask == MaskVariant::kBias) {
    auto bias = g->tensor(fe::graph::Tensor_attributes()
                              .set_name("key_mask_bias")
                              .set_uid(kUidBias)
                              .set_data_type(dt)
                              .set_dim(bias_dim)
                              .set_stride(bias_stride));
    options.set_bias(bias);
  }
  std::shared_ptr<fe::graph::Tensor_attributes> o;
  if (s.fp8) {
    auto scalar = [&](const char* name, int64_t uid) {
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim({1, 1, 1, 1})
                           .set_stride({1, 1, 1, 1})
                           .set_data_type(fe::DataType_t::FLOAT));
    };
    auto outputs =
        g->sdpa_fp8(q, k, v, scalar("descale_q", kUidDescaleQ), scalar("descale_k", kUidDescaleK),
                    scalar("descale_v", kUidDescaleV), scalar("descale_s", kUidDescaleS),
                    scalar("scale_s", kUidScaleS), scalar("scale_o", kUidScaleO), options);
    o = outputs[0];
    for (auto& [amax, uid] : {std::make_pair(outputs[2], int64_t{kUidAmaxS}),
                              std::make_pair(outputs[3], int64_t{kUidAmaxO})})
      amax->set_output(true)
          .set_uid(uid)
          .set_dim({1, 1, 1, 1})
          .set_stride({1, 1, 1, 1})
          .set_data_type(fe::DataType_t::FLOAT);
  } else {
    o = g->sdpa(q, k, v, options)[0];
  }
  o->set_output(true)
      .set_uid(kUidO)
      .set_data_type(dt)
      .set_dim({s.b, s.heads, s.tq, s.d})
      .set_stride({s.tq * (s.out_ld ? s.out_ld : hd), s.d, s.out_ld ? s.out_ld : hd, 1});

  int64_t workspace = 0;
  const std::string why = build_graph_plan(
      *g, handle, [](fe::graph::Graph&) {}, &workspace);
  if (!why.empty()) return why;
  plan->graph = std::move(g);
  plan->workspace = workspace;
  return std::string();
}

// The plan for `s`, built on first use (the failure remembered as an empty plan).
Plan& plan_for(DeviceContext& ctx, SdpaState& state, const ShapeKey& s) {
  auto it = state.plans.find(s);
  if (it != state.plans.end()) return it->second;
  Plan plan;
  std::string why;
  if (s.mask != MaskVariant::kBias) {
    why = build_graph(state.handle, s, {}, {}, &plan);
  } else {
    // The bias broadcast over queries with a zero stride ([B, 1, Tq, Tk], as PyTorch passes an
    // expanded mask), else as a size-1 query dim ([B, 1, 1, Tk]).
    const int64_t ld = bias_stride(s.tk);
    why = build_graph(state.handle, s, {s.b, 1, s.tq, s.tk}, {ld, ld, 0, 1}, &plan);
    if (!why.empty()) {
      const std::string second =
          build_graph(state.handle, s, {s.b, 1, 1, s.tk}, {ld, ld, ld, 1}, &plan);
      why = second.empty()
                ? std::string()
                : str_cat("bias [B, 1, Tq, Tk] stride 0: ", why, "; bias [B, 1, 1, Tk]: ", second);
    }
  }
  if (!why.empty()) {
    plan = Plan();
    LATENT_WARN(ctx.label(), ": cuDNN SDPA has no plan for attention ", describe(s), " (", why,
                "); ", instead(s),
                " (diagnose with CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr "
                "CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr)");
  } else {
    log_path_once(s, "built",
                  str_cat("cuDNN SDPA graph built, workspace ", plan.workspace, " bytes"));
  }
  return state.plans.emplace(s, std::move(plan)).first->second;
}

// The plan for `s`; null when it is not built yet and cannot be now (the stream is capturing).
Plan* find_plan(DeviceContext& ctx, SdpaState& state, const ShapeKey& s, bool capturing) {
  auto it = state.plans.find(s);
  if (it != state.plans.end()) return &it->second;
  if (capturing) return nullptr;
  return &plan_for(ctx, state, s);
}

// The device block of key lengths for the padding graph of `s` (see SdpaState::lengths),
// uploaded on first use; null when it is not there and cannot be made now (the stream is
// capturing, or kMaxLengthSets sets are kept already).
Result<void*> device_lengths(SdpaState& state, cudaStream_t stream, const ShapeKey& s,
                             const int64_t* key_lengths, bool capturing) {
  std::pair<int64_t, std::vector<int32_t>> key(s.tq, std::vector<int32_t>());
  for (int64_t i = 0; i < s.b; ++i) key.second.push_back(static_cast<int32_t>(key_lengths[i]));
  auto it = state.lengths.find(key);
  if (it != state.lengths.end()) return it->second;
  if (capturing || state.lengths.size() >= kMaxLengthSets) return static_cast<void*>(nullptr);
  const int64_t offset = lengths_offset(s.b);
  std::vector<int32_t> host(static_cast<size_t>(2 * offset / 4), 0);
  for (int64_t i = 0; i < s.b; ++i) {
    host[static_cast<size_t>(i)] = static_cast<int32_t>(s.tq);
    host[static_cast<size_t>(offset / 4 + i)] = key.second[static_cast<size_t>(i)];
  }
  const size_t bytes = host.size() * sizeof(int32_t);
  void* block = nullptr;
  LATENT_CUDA_CHECK(cudaMalloc(&block, bytes));
  // From pageable memory: the call returns once `host` is staged, so it may go out of scope.
  const cudaError_t rc = cudaMemcpyAsync(block, host.data(), bytes, cudaMemcpyHostToDevice, stream);
  if (rc != cudaSuccess) {
    LATENT_CUDA_WARN(cudaFree(block));
    LATENT_CUDA_CHECK(rc);
  }
  count_host_to_device(bytes);
  state.lengths.emplace(std::move(key), block);
  return block;
}

// Queues `plan`; false when cuDNN fails to execute it (nothing queued: warned, and the plan
// dropped so that what comes instead takes this shape from now on).
Result<bool> execute(DeviceContext& ctx, SdpaState& state, const ShapeKey& s, Plan& plan,
                     std::unordered_map<int64_t, void*>& pack) {
  TempBuffer workspace;
  if (plan.workspace > 0) LATENT_TRY(workspace.allocate(ctx, static_cast<size_t>(plan.workspace)));
  fe::error_t e = plan.graph->execute(state.handle, pack, workspace.get());
  if (e.is_bad()) {
    LATENT_WARN(ctx.label(), ": cuDNN SDPA for attention ", describe(s), " failed to execute (",
                e.get_message(), "); ", instead(s),
                " (diagnose with CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=stderr "
                "CUDNN_FRONTEND_LOG_INFO=1 CUDNN_FRONTEND_LOG_FILE=stderr)");
    plan = Plan();
    return false;
  }
  return true;
}
#endif  // LATENT_HAVE_CUDNN_FRONTEND

}  // namespace

bool sdpa_compiled() {
#ifdef LATENT_HAVE_CUDNN_FRONTEND
  return true;
#else
  return false;
#endif
}

SdpaCounters sdpa_counters() {
  SdpaCounters c;
  c.cudnn = g_cudnn_calls.load();
  c.cudnn_padding = g_cudnn_padding_calls.load();
  c.cudnn_fp8 = g_cudnn_fp8_calls.load();
  c.fallback = g_fallback_calls.load();
  return c;
}

Result<bool> sdpa_attention(DeviceContext& ctx, const void* q, const void* k, const void* v,
                            const void* key_mask, const int64_t* key_lengths, void* out, int64_t b,
                            int64_t tq, int64_t tk, int heads, int64_t d, DType dtype,
                            int64_t out_ld) {
  ShapeKey s;
  s.b = b, s.tq = tq, s.tk = tk, s.heads = heads, s.d = d, s.dtype = dtype;
  s.out_ld = out_ld == heads * d ? 0 : out_ld;
  s.mask = key_mask != nullptr ? MaskVariant::kBias : MaskVariant::kNone;
  if (!sdpa_compiled()) return fall_back(s, "built without cudnn-frontend");
  if (env_off("LATENT_CUDNN_SDPA")) return fall_back(s, "LATENT_CUDNN_SDPA=0");
  if (const AttentionKernel forced = attention_kernel_from_env();
      forced != AttentionKernel::kDefault)
    return fall_back(s, str_cat("LATENT_ATTENTION_KERNEL=", attention_kernel_name(forced)));
  if (dtype == DType::kF32) return fall_back(s, "fp32");
  if (d < 8 || d > 256 || d % 8 != 0) return fall_back(s, "head dim not a multiple of 8 <= 256");
  if (ctx.properties().major < 8) return fall_back(s, "below sm_80");
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out))
    return fall_back(s, "a tensor is not 16-byte aligned");
  if (s.out_ld % 8 != 0) return fall_back(s, "output rows not 16 bytes apart");

#ifdef LATENT_HAVE_CUDNN_FRONTEND
  Result<std::shared_ptr<SdpaState>> got = state_for(ctx);
  if (!got.ok()) return fall_back(s, got.status().message());
  const std::shared_ptr<SdpaState> state = got.value();
  std::lock_guard<std::mutex> lock(state->mutex);
  // Building plans and uploading lengths may allocate and synchronise: never inside a capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LATENT_CUDA_CHECK(cudaStreamIsCapturing(ctx.stream(), &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  std::unordered_map<int64_t, void*> pack = {{kUidQ, const_cast<void*>(q)},
                                             {kUidK, const_cast<void*>(k)},
                                             {kUidV, const_cast<void*>(v)},
                                             {kUidO, out}};

  if (key_mask && key_lengths && !env_off("LATENT_CUDNN_PADDING_MASK")) {
    ShapeKey p = s;
    p.mask = MaskVariant::kPadding;
    Plan* plan = find_plan(ctx, *state, p, capturing);
    if (plan && plan->graph) {
      LATENT_ASSIGN_OR_RETURN(void* lengths,
                              device_lengths(*state, ctx.stream(), p, key_lengths, capturing));
      if (lengths) {
        std::unordered_map<int64_t, void*> padded = pack;
        padded[kUidSeqQ] = lengths;
        padded[kUidSeqKv] = static_cast<char*>(lengths) + lengths_offset(b);
        LATENT_ASSIGN_OR_RETURN(const bool ran, execute(ctx, *state, p, *plan, padded));
        if (ran) {
          ++g_cudnn_calls;
          ++g_cudnn_padding_calls;
          log_path_once(p, "cudnn", "cuDNN SDPA");
          return true;
        }
      }
    }
  }

  Plan* plan = find_plan(ctx, *state, s, capturing);
  if (!plan) return fall_back(s, "no cuDNN graph built before the capture began");
  if (!plan->graph) return fall_back(s, "cuDNN has no engine for this shape");
  TempBuffer bias;
  if (s.mask == MaskVariant::kBias) {
    const int64_t ld = bias_stride(tk);
    LATENT_TRY(bias.allocate(ctx, static_cast<size_t>(b * ld) * dtype_size(dtype)));
    LATENT_TRY(launch_sdpa_mask_bias(key_mask, bias.get(), b, tk, ld, dtype, ctx.stream()));
    pack[kUidBias] = bias.get();
  }
  LATENT_ASSIGN_OR_RETURN(const bool ran, execute(ctx, *state, s, *plan, pack));
  if (!ran) return fall_back(s, "cuDNN execution failed");
  ++g_cudnn_calls;
  log_path_once(s, "cudnn", "cuDNN SDPA");
  return true;
#else
  (void)ctx, (void)out, (void)key_lengths;
  return fall_back(s, "built without cudnn-frontend");
#endif
}

Result<bool> sdpa_attention_fp8(DeviceContext& ctx, const void* q8, const void* k8, const void* v8,
                                const int64_t* key_lengths, void* o8, float* scalars, int64_t b,
                                int64_t tq, int64_t tk, int heads, int64_t d, DType dtype) {
  ShapeKey s;
  s.b = b, s.tq = tq, s.tk = tk, s.heads = heads, s.d = d, s.dtype = dtype, s.fp8 = true;
  s.mask = key_lengths ? MaskVariant::kPadding : MaskVariant::kNone;
  if (!sdpa_compiled()) return fall_back(s, "built without cudnn-frontend");
  if (env_off("LATENT_CUDNN_SDPA")) return fall_back(s, "LATENT_CUDNN_SDPA=0");
  if (ctx.properties().major < 9) return fall_back(s, "FP8 attention needs sm_90 or newer");
  if (d < 16 || d > 256 || d % 16 != 0)
    return fall_back(s, "head dim not a multiple of 16 <= 256 (FP8)");
  if (!aligned16(q8) || !aligned16(k8) || !aligned16(v8) || !aligned16(o8) || !aligned16(scalars))
    return fall_back(s, "a tensor is not 16-byte aligned");

#ifdef LATENT_HAVE_CUDNN_FRONTEND
  Result<std::shared_ptr<SdpaState>> got = state_for(ctx);
  if (!got.ok()) return fall_back(s, got.status().message());
  const std::shared_ptr<SdpaState> state = got.value();
  std::lock_guard<std::mutex> lock(state->mutex);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LATENT_CUDA_CHECK(cudaStreamIsCapturing(ctx.stream(), &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  Plan* plan = find_plan(ctx, *state, s, capturing);
  if (!plan) return fall_back(s, "no cuDNN graph built before the capture began");
  if (!plan->graph) return fall_back(s, "cuDNN has no FP8 engine for this shape");
  std::unordered_map<int64_t, void*> pack = {{kUidQ, const_cast<void*>(q8)},
                                             {kUidK, const_cast<void*>(k8)},
                                             {kUidV, const_cast<void*>(v8)},
                                             {kUidO, o8},
                                             {kUidDescaleQ, scalars + kFp8DescaleQ},
                                             {kUidDescaleK, scalars + kFp8DescaleQ + 1},
                                             {kUidDescaleV, scalars + kFp8DescaleQ + 2},
                                             {kUidDescaleS, scalars + kFp8DescaleS},
                                             {kUidScaleS, scalars + kFp8ScaleS},
                                             {kUidScaleO, scalars + kFp8ScaleO},
                                             {kUidAmaxS, scalars + kFp8AmaxS},
                                             {kUidAmaxO, scalars + kFp8AmaxO}};
  if (key_lengths) {
    LATENT_ASSIGN_OR_RETURN(void* lengths,
                            device_lengths(*state, ctx.stream(), s, key_lengths, capturing));
    if (!lengths) return fall_back(s, "key lengths not on the device before the capture began");
    pack[kUidSeqQ] = lengths;
    pack[kUidSeqKv] = static_cast<char*>(lengths) + lengths_offset(b);
  }
  LATENT_ASSIGN_OR_RETURN(const bool ran, execute(ctx, *state, s, *plan, pack));
  if (!ran) return fall_back(s, "cuDNN execution failed");
  ++g_cudnn_calls;
  ++g_cudnn_fp8_calls;
  if (key_lengths) ++g_cudnn_padding_calls;
  log_path_once(s, "cudnn", "cuDNN FP8 SDPA");
  return true;
#else
  (void)ctx, (void)q8, (void)k8, (void)v8, (void)o8, (void)scalars;
  return fall_back(s, "built without cudnn-frontend");
#endif
}

}  // namespace latent::cuda
