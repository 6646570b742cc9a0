// The build steps every cuDNN operation graph of this backend goes through (cudnn-frontend; only
// files compiled with LATENT_HAVE_CUDNN_FRONTEND include this: sdpa.cpp, conv_fused.cpp).
#pragma once

#include <cudnn_frontend.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/dtype.h"

namespace latent::cuda {

// cuDNN's name for a half-precision dtype of ours: bf16, else fp16.
inline cudnn_frontend::DataType_t half_type(DType t) {
  return t == DType::kBF16 ? cudnn_frontend::DataType_t::BFLOAT16
                           : cudnn_frontend::DataType_t::HALF;
}

// An empty graph with `io` inputs and outputs and fp32 intermediates and arithmetic.
inline std::shared_ptr<cudnn_frontend::graph::Graph> new_graph(cudnn_frontend::DataType_t io) {
  namespace fe = cudnn_frontend;
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(io)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// Validates `g`, builds its operation graph on `handle`, asks cuDNN's heuristics (mode A, then
// the fallback list) for engine configurations, lets `filter(g)` deselect some, checks support
// and builds the heuristics' first plan that builds (`candidates` > 1: the first that many that
// build, their indices in *built, the first of them the graph's candidate). `want` (an engine's
// name, e.g. a choice saved earlier): that engine alone where it is among the candidates and
// builds (*built = its index alone). Empty string: built, with the candidate's workspace size in
// *workspace; else the step that failed and cuDNN's message.
template <typename Filter>
std::string build_graph_plan(cudnn_frontend::graph::Graph& g, cudnnHandle_t handle, Filter&& filter,
                             int64_t* workspace, int candidates = 1,
                             std::vector<int64_t>* built = nullptr,
                             const std::string& want = std::string()) {
  namespace fe = cudnn_frontend;
  fe::error_t e = g.validate();
  if (e.is_bad()) return "validate: " + e.get_message();
  e = g.build_operation_graph(handle);
  if (e.is_bad()) return "build_operation_graph: " + e.get_message();
  e = g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (e.is_bad()) return "create_execution_plans: " + e.get_message();
  filter(g);
  e = g.check_support(handle);
  if (e.is_bad()) return "check_support: " + e.get_message();
  if (!want.empty() && built) {
    // (names come from the engine configurations: nothing is compiled to find it)
    for (int64_t i = 0; i < g.get_execution_plan_count(); ++i) {
      std::string name;
      if (!g.get_plan_name_at_index(i, name).is_good() || name != want) continue;
      if (g.build_plan_at_index(handle, i).is_bad() ||
          g.get_workspace_size_plan_at_index(i, *workspace).is_bad())
        break;
      *built = {i};
      return std::string();
    }
  }
  if (candidates > 1) {
    // The first `candidates` engines that build (the caller times them).
    std::vector<int64_t> ok;
    for (int64_t i = 0;
         i < g.get_execution_plan_count() && static_cast<int>(ok.size()) < candidates; ++i)
      if (g.build_plan_at_index(handle, i).is_good()) ok.push_back(i);
    if (ok.empty()) return "build_plan_at_index: no candidate engine built";
    // the heuristics' first stays the graph's candidate until a caller chooses by timing
    e = g.build_plan_at_index(handle, ok.front());
    if (e.is_bad()) return "build_plan_at_index: " + e.get_message();
    if (built) *built = ok;
  } else {
    e = g.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
    if (e.is_bad()) return "build_plans: " + e.get_message();
  }
  e = g.get_workspace_size(*workspace);
  if (e.is_bad()) return "get_workspace_size: " + e.get_message();
  return std::string();
}

}  // namespace latent::cuda
