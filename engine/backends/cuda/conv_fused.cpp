// Convolutions with their epilogue fused, through cuDNN's graph API (cudnn-frontend): one
// operation graph conv_fprop -> [+ bias] -> [+ residual] -> [ReLU | SiLU] per shape and
// epilogue, run by whatever engine cuDNN's heuristics rank first (a precompiled fused kernel or
// a runtime-fusion one). The conv result stays in fp32 registers through the epilogue, so the
// output is written once instead of written, read and written again by a separate pass. A
// convolution without an epilogue takes the same route: on the H100 the graph API's engine
// choice was also faster than the legacy API's for the bare convolution (bench/NOTES.md).
// Without cudnn-frontend (the build found no headers) forward_fused() answers "not fused" and
// the caller runs the plain convolution and its own epilogue, as it does for any shape or
// epilogue cuDNN has no engine for.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "engine/backends/cuda/check.h"
#include "engine/backends/cuda/conv2d.cuh"
#include "engine/core/log.h"
#include "engine/core/plan_cache.h"

#ifdef LATENT_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>

#include "engine/backends/cuda/cudnn_graph.h"
#endif

namespace latent::cuda {

namespace {
std::atomic<int64_t> g_fused_calls{0};
}  // namespace

int64_t ConvPlanCache::fused_calls() { return g_fused_calls.load(); }

#ifdef LATENT_HAVE_CUDNN_FRONTEND
namespace fe = cudnn_frontend;

namespace {

enum : int64_t { kUidX = 1, kUidW, kUidBias, kUidResidual, kUidY };

std::string describe_fused(const ConvShape& s, bool bias, bool residual, Activation act) {
  std::string what = describe(s);
  if (bias) what += " + bias";
  if (residual) what += " + residual";
  if (act == Activation::kReLU) what += ", ReLU";
  if (act == Activation::kSiLU) what += ", SiLU";
  return what;
}

// NHWC (or NDHWC) strides of a tensor whose dims are given in cuDNN's N, C, (D,) H, W order.
std::vector<int64_t> channels_last(const std::vector<int64_t>& dim) {
  std::vector<int64_t> stride(dim.size());
  int64_t step = dim[1];
  stride[1] = 1;
  for (size_t i = dim.size() - 1; i >= 2; --i) {
    stride[i] = step;
    step *= dim[i];
  }
  stride[0] = step;
  return stride;
}

struct FusedPlan {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN has no engine for it
  int64_t workspace = 0;
  bool tune = false;           // several engines built: time them on the first call (choose_engine)
  int64_t index = -1;          // the engine chosen by timing (-1: the graph's own candidate)
  std::vector<int64_t> built;  // the candidates built, in the heuristics' order
};

// The plan cache's key for a fused graph's engine choice (LATENT_CUDNN_FUSION=precompiled keeps
// its own: its candidates leave out the engines compiled at plan time).
std::string fused_plan_key(const ConvShape& s, const ConvEpilogue& e, bool runtime_compiled) {
  return str_cat("conv fused ", describe_fused(s, e.bias, e.residual, e.act),
                 runtime_compiled ? "" : " (precompiled engines)");
}

// The plan cache's blob key for the serialized plan of a fused graph: the graph's key and its
// engine (the heuristics' first, or the choice `want` saved by an earlier process). Empty where a
// graph's engines are yet to be timed (tune > 1 and no choice saved): nothing is loaded then.
std::string kept_plan_key(const ConvShape& s, const ConvEpilogue& e, bool runtime_compiled,
                          int tune, const std::string& want) {
  if (tune > 1 && want.empty()) return std::string();
  return str_cat(fused_plan_key(s, e, runtime_compiled), " | ",
                 want.empty() ? std::string("the heuristics' first") : str_cat("engine ", want));
}

// A plan serialized by an earlier process (LATENT_CUDNN_KEEP_COMPILED) into `plan`: true when
// loaded (nothing to compile), false (and `plan` untouched) when there is none or cuDNN refuses
// it (another cuDNN or GPU would be another plan-cache file; refused all the same, it is built).
bool load_kept_plan(cudnnHandle_t handle, const PlanCache& disk, const std::string& key,
                    FusedPlan* plan) {
  std::vector<uint8_t> data;
  if (!disk.read_blob(key, &data)) return false;
  auto g = std::make_shared<fe::graph::Graph>();
  fe::error_t rc = g->deserialize(handle, data, /*enforce_precompiled=*/false,
                                  /*run_warmup=*/false);
  int64_t workspace = 0;
  if (rc.is_good()) rc = g->get_workspace_size(workspace);
  if (rc.is_bad()) {
    LATENT_WARN("conv fused: the plan kept in ", disk.blob_path(key), " for ", key,
                " does not load (", rc.get_message(), "): building it");
    return false;
  }
  plan->graph = std::move(g);
  plan->workspace = workspace;
  plan->tune = false;
  plan->index = -1;
  plan->built.clear();
  return true;
}

// Serializes `plan` under `key` when cuDNN compiled its engine while planning (the only engines
// it serializes, and the only ones worth it) and it is the graph's plan (not one of several
// built to be timed). Failures are logged: the plan runs all the same.
void keep_plan(const PlanCache& disk, const std::string& key, const FusedPlan& plan) {
  if (!plan.graph || plan.built.size() > 1) return;
  std::vector<fe::BehaviorNote_t> notes;
  if (plan.graph->get_behavior_notes(notes).is_bad() ||
      std::find(notes.begin(), notes.end(), fe::BehaviorNote_t::RUNTIME_COMPILATION) == notes.end())
    return;
  std::vector<uint8_t> data;
  fe::error_t rc = plan.graph->serialize(data, /*serialize_structure=*/false);
  if (rc.is_bad()) {
    LATENT_DEBUG("conv fused: ", key, ": cuDNN does not serialize its plan (", rc.get_message(),
                 ")");
    return;
  }
  if (Status st = disk.write_blob(key, data); !st.ok()) {
    LATENT_WARN("conv fused: ", st.message(), " (the compiled plan is not kept)");
    return;
  }
  LATENT_INFO("conv fused: ", key, ": compiled plan kept (", data.size(), " bytes in ",
              disk.blob_path(key), ")");
}

// Builds `s` with epilogue `e` into `plan`: by the engine cuDNN's heuristics rank first, or
// (`runtime_compiled` false) the first of those cuDNN ships compiled; `tune` > 1: that many
// candidates, timed on the first call (plan->tune); `want`: that engine alone where it is among
// the candidates (a choice saved by an earlier process). Empty string: built; else the step that
// failed and cuDNN's message.
std::string build_fused(cudnnHandle_t handle, const ConvShape& s, const ConvEpilogue& e,
                        bool runtime_compiled, int tune, const std::string& want, FusedPlan* plan);

}  // namespace

namespace {

// Times the engines built for `plan` on this call's tensors (each run computes the same y: 3
// runs each, the median kept) and chooses the fastest if it beats the heuristics' first by at
// least 10 %, else that first. The margin keeps the choice (and so the output's bits, which
// differ between engines) the same from run to run where engines are close, but not where one is
// near 10 % faster: two processes on one H100 chose differently for a 90p graph (12 % against
// 9 %). Hence the plan cache: the timed choice is saved in `disk` under `key`, and a
// later process builds that engine alone (forward_fused), so one machine's processes choose alike
// once one has saved its choice (workers on several machines still may not:
// LATENT_CUDNN_SEARCH=heuristic turns the timing off).
Status choose_engine(cudnnHandle_t handle, const ConvShape& s, const ConvEpilogue& e,
                     std::unordered_map<int64_t, void*>& pack, DeviceContext& ctx, PlanCache* disk,
                     const std::string& key, FusedPlan* plan) {
  if (plan->built.size() < 2) return ok_status();
  const std::string what = describe_fused(s, e.bias, e.residual, e.act);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t most = 0;
  for (int64_t i : plan->built) {
    int64_t ws = 0;
    if (plan->graph->get_workspace_size_plan_at_index(i, ws).is_good()) most = std::max(most, ws);
  }
  TempBuffer scratch;
  if (most > 0) LATENT_TRY(scratch.allocate(ctx, static_cast<size_t>(most)));
  TimingEvents events;
  LATENT_TRY(events.create());
  std::vector<float> ms(plan->built.size(), -1.f);
  for (size_t k = 0; k < plan->built.size(); ++k) {
    std::vector<float> runs;
    for (int r = 0; r < 4; ++r) {  // the first run is a warm-up
      events.start(ctx.stream());
      const fe::error_t rc =
          plan->graph->execute_plan_at_index(handle, pack, scratch.get(), plan->built[k]);
      events.stop(ctx.stream());
      const float t = rc.is_bad() ? -1.f : events.elapsed_ms();
      if (t < 0.f) break;
      if (r > 0) runs.push_back(t);
    }
    if (runs.size() == 3) {
      std::sort(runs.begin(), runs.end());
      ms[k] = runs[1];
    }
  }
  (void)cudaGetLastError();
  size_t best = 0;
  for (size_t k = 1; k < ms.size(); ++k)
    if (ms[k] > 0.f && (ms[best] <= 0.f || ms[k] < ms[best])) best = k;
  // the first unless another is >= 10 % faster (or the first failed to run)
  if (ms[0] > 0.f && ms[best] > 0.9f * ms[0]) best = 0;
  if (ms[best] <= 0.f) return ok_status();  // none ran: the graph's own candidate
  plan->index = plan->built[best];
  int64_t ws = 0;
  if (plan->graph->get_workspace_size_plan_at_index(plan->index, ws).is_good())
    plan->workspace = ws;
  std::string first, kept;
  (void)plan->graph->get_plan_name_at_index(plan->built[0], first);
  (void)plan->graph->get_plan_name_at_index(plan->index, kept);
  LATENT_INFO(
      "conv fused: ", what, ": ", plan->built.size(), " engines timed in ",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
      " ms: ", kept, " (", ms[best], " ms) ", best == 0 ? "is" : "replaces",
      " the heuristics' first ", first, " (", ms[0], " ms)");
  if (disk && !kept.empty())
    disk->put(key, nlohmann::json{{"engine", kept},
                                  {"ms", ms[best]},
                                  {"first", first},
                                  {"first_ms", ms[0]},
                                  {"candidates", plan->built.size()}});
  return ok_status();
}

}  // namespace

struct ConvPlanCache::FusedPlans {
  std::map<std::tuple<ConvShape, bool, bool, Activation>, FusedPlan> plans;
};

void ConvPlanCache::FusedPlansDeleter::operator()(FusedPlans* p) const { delete p; }

bool ConvPlanCache::fusion_available() { return true; }

Result<bool> ConvPlanCache::forward_fused(const ConvShape& s, const void* x, const void* w, void* y,
                                          const ConvEpilogue& e, DeviceContext& ctx) {
  if (!fusion_) return false;
  if (s.dtype == DType::kF32) return false;  // fp32 keeps the precision rules of forward()
  if (e.act != Activation::kNone && e.act != Activation::kReLU && e.act != Activation::kSiLU)
    return false;
  // Below 32 channels in or out (the RGB and latent ends, the tiny test models) the plain path:
  // on the H100 the graphs chosen for the 8- and 16-channel convolutions of the tiny KL model
  // took its bf16 encoder from 7.9e-3 to 1.0e-2 relative L2 against fp32, while every model of
  // 64 channels and more came closer (bench/NOTES.md, session 12); such convolutions are cheap.
  if (s.c < 32 || s.k < 32) return false;
  if (!fused_) fused_.reset(new FusedPlans());
  const auto key = std::make_tuple(s, e.bias != nullptr, e.residual != nullptr, e.act);
  auto it = fused_->plans.find(key);
  if (it == fused_->plans.end()) {
    // Building may synchronise and allocate: never inside a capture (the plain path then runs,
    // as it would for a shape cuDNN has no engine for).
    if (capturing_) return false;
    FusedPlan plan;
    const auto t0 = std::chrono::steady_clock::now();
    // The engine cuDNN's heuristics rank first: one it ships compiled builds in milliseconds, one
    // it compiles (the residual-add graphs) in 0.1-0.8 s each on the H100. Compiling once per kind
    // of convolution through a kernel cache (cuDNN's dynamic shapes) started faster but its
    // kernels ran the default model 1.3x slower (bench/NOTES.md, session 13).
    // A choice timed by an earlier process (the plan cache): that engine alone is built.
    const int tune = s.kt > 1 ? fusion_tune_3d_ : fusion_tune_2d_;  // CudaBackend::Options
    std::string want;
    nlohmann::json saved;
    if (tune > 1 && disk_ &&
        disk_->lookup(fused_plan_key(s, e, fusion_runtime_compiled_), &saved) &&
        saved.is_object() && saved.contains("engine") && saved["engine"].is_string())
      want = saved["engine"].get<std::string>();
    // LATENT_CUDNN_KEEP_COMPILED: a plan an earlier process compiled and kept is loaded instead.
    const std::string kept_key = fusion_keep_compiled_ && disk_
                                     ? kept_plan_key(s, e, fusion_runtime_compiled_, tune, want)
                                     : std::string();
    const bool loaded = !kept_key.empty() && load_kept_plan(handle_, *disk_, kept_key, &plan);
    const std::string why =
        loaded ? std::string()
               : build_fused(handle_, s, e, fusion_runtime_compiled_, tune, want, &plan);
    if (why.empty() && !loaded && !kept_key.empty()) keep_plan(*disk_, kept_key, plan);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!why.empty()) {
      plan = FusedPlan();
      LATENT_DEBUG("conv fused: cuDNN has no fused graph for ",
                   describe_fused(s, e.bias, e.residual, e.act), " (", why, "; ", ms,
                   " ms); the convolution and a separate epilogue pass run instead");
    } else {
      // What planning costs at start-up (engines compiled at plan time take the longest).
      LATENT_INFO("conv fused: ", describe_fused(s, e.bias, e.residual, e.act),
                  loaded ? ": loaded in " : ": built in ", ms, " ms, ", plan.workspace,
                  " bytes of workspace",
                  loaded ? str_cat(" (the plan kept in ", disk_->blob_path(kept_key), ")")
                  : plan.index >= 0 ? str_cat(", engine ", want, " (saved in ", disk_->path(), ")")
                  : !want.empty()   ? str_cat("; the saved engine ", want,
                                              " is not among the candidates built here")
                                    : std::string());
    }
    it = fused_->plans.emplace(key, std::move(plan)).first;
  }
  FusedPlan& plan = it->second;
  if (!plan.graph) return false;
  std::unordered_map<int64_t, void*> pack = {
      {kUidX, const_cast<void*>(x)}, {kUidW, const_cast<void*>(w)}, {kUidY, y}};
  if (e.bias) pack[kUidBias] = const_cast<void*>(e.bias);
  if (e.residual) pack[kUidResidual] = const_cast<void*>(e.residual);
  if (plan.tune && !capturing_) {
    plan.tune = false;
    LATENT_TRY(choose_engine(handle_, s, e, pack, ctx, disk_.get(),
                             fused_plan_key(s, e, fusion_runtime_compiled_), &plan));
  }
  TempBuffer workspace;  // freed in stream order once the graph is queued
  if (plan.workspace > 0) LATENT_TRY(workspace.allocate(ctx, static_cast<size_t>(plan.workspace)));
  fe::error_t rc = plan.index >= 0 ? plan.graph->execute_plan_at_index(handle_, pack,
                                                                       workspace.get(), plan.index)
                                   : plan.graph->execute(handle_, pack, workspace.get());
  if (rc.is_bad()) {
    const std::string what =
        str_cat("conv fused: cuDNN failed to run ", describe_fused(s, e.bias, e.residual, e.act),
                " on ", ctx.label(), ": ", rc.get_message());
    if (capturing_) return Status::error(what);  // the capture is spoilt: the plan's to handle
    // Dropped, so that the plain convolution and its epilogue pass take this shape from now on.
    LATENT_WARN(what, "; running it as a convolution and a separate epilogue pass from now on");
    plan = FusedPlan();
    return false;
  }
  ++g_fused_calls;
  return true;
}

namespace {

std::string build_fused(cudnnHandle_t handle, const ConvShape& s, const ConvEpilogue& e,
                        bool runtime_compiled, int tune, const std::string& want, FusedPlan* plan) {
  const fe::DataType_t dt = half_type(s.dtype);
  auto g = new_graph(dt);
  const bool video = s.kt > 1;
  std::vector<int64_t> xdim, wdim, ydim, bdim;
  fe::graph::Conv_fprop_attributes conv;
  conv.set_name("conv");
  if (video) {  // NDHWC [1][d][h][w][c] * KTRSC, valid in time
    xdim = {1, s.c, s.d, s.h, s.w};
    wdim = {s.k, s.c, s.kt, s.r, s.s};
    ydim = {1, s.k, s.out_d(), s.out_h(), s.out_w()};
    bdim = {1, s.k, 1, 1, 1};
    conv.set_padding({0, s.pad_h, s.pad_w})
        .set_stride({1, s.stride, s.stride})
        .set_dilation({1, 1, 1});
  } else {
    xdim = {s.n, s.c, s.h, s.w};
    wdim = {s.k, s.c, s.r, s.s};
    ydim = {s.n, s.k, s.out_h(), s.out_w()};
    bdim = {1, s.k, 1, 1};
    // Asymmetric padding as the graph's pre / post padding: no padded copy of the input.
    conv.set_pre_padding({s.pad_h, s.pad_w})
        .set_post_padding({s.pad_h + s.extra_b, s.pad_w + s.extra_r})
        .set_stride({s.stride, s.stride})
        .set_dilation({1, 1});
  }
  auto tensor = [&](const char* name, int64_t uid, const std::vector<int64_t>& dim) {
    return g->tensor(fe::graph::Tensor_attributes()
                         .set_name(name)
                         .set_uid(uid)
                         .set_data_type(dt)
                         .set_dim(dim)
                         .set_stride(channels_last(dim)));
  };
  auto out = g->conv_fprop(tensor("x", kUidX, xdim), tensor("w", kUidW, wdim), conv);
  out->set_data_type(fe::DataType_t::FLOAT);
  if (e.bias)
    out = g->pointwise(
        out, tensor("bias", kUidBias, bdim),
        fe::graph::Pointwise_attributes().set_name("bias").set_mode(fe::PointwiseMode_t::ADD));
  if (e.residual)
    out = g->pointwise(
        out, tensor("residual", kUidResidual, ydim),
        fe::graph::Pointwise_attributes().set_name("residual").set_mode(fe::PointwiseMode_t::ADD));
  if (e.act == Activation::kReLU)
    out = g->pointwise(out, fe::graph::Pointwise_attributes().set_name("relu").set_mode(
                                fe::PointwiseMode_t::RELU_FWD));
  if (e.act == Activation::kSiLU)
    out = g->pointwise(out, fe::graph::Pointwise_attributes()
                                .set_name("silu")
                                .set_mode(fe::PointwiseMode_t::SWISH_FWD)
                                .set_swish_beta(1.f));
  out->set_output(true).set_uid(kUidY).set_data_type(dt).set_dim(ydim).set_stride(
      channels_last(ydim));

  // The same rules as the plain convolution's choice: the same bytes on every run, inputs kept
  // in the precision they come in, and sums kept in fp32.
  // Without `runtime_compiled`, also no engine that compiles its kernel while the plan is built.
  auto deselect = [runtime_compiled](fe::graph::Graph& graph) {
    graph.deselect_numeric_notes({fe::NumericalNote_t::NONDETERMINISTIC,
                                  fe::NumericalNote_t::DOWN_CONVERT_INPUTS,
                                  fe::NumericalNote_t::REDUCED_PRECISION_REDUCTION});
    if (!runtime_compiled) graph.deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
  };
  int64_t workspace = 0;
  const std::string why =
      build_graph_plan(*g, handle, deselect, &workspace, tune, &plan->built, want);
  if (!why.empty()) return why;
  plan->graph = std::move(g);
  plan->workspace = workspace;
  plan->tune = plan->built.size() > 1;
  if (!want.empty() && plan->built.size() == 1) {
    std::string name;
    if (plan->graph->get_plan_name_at_index(plan->built[0], name).is_good() && name == want)
      plan->index = plan->built[0];  // the saved choice (forward_fused logs it)
  }
  return std::string();
}

}  // namespace

#else  // no cudnn-frontend: nothing is fused, the caller runs its own epilogue

struct ConvPlanCache::FusedPlans {};
void ConvPlanCache::FusedPlansDeleter::operator()(FusedPlans* p) const { delete p; }
bool ConvPlanCache::fusion_available() { return false; }

Result<bool> ConvPlanCache::forward_fused(const ConvShape&, const void*, const void*, void*,
                                          const ConvEpilogue&, DeviceContext&) {
  return false;
}

#endif

}  // namespace latent::cuda
