// A VAE part planned for one input shape: warmed up once (so every convolution algorithm is
// chosen, and cached on disk, at negotiation time), then, on backends that support it, captured
// as one graph that each run replays.
//
//   VaePlanner planner(model);                        // at negotiation: per model
//   planner.plan(VaePart::kDecode, example_latent);   // builds and caches the plan (optional)
//   ...
//   auto y = planner.run(VaePart::kDecode, latent);   // per frame: copy in + one graph launch
//
// With a graph, run() returns the plan's fixed output tensor: the same device buffer every run,
// valid until the next run() of the same plan. Download it, or queue the ops that read it on
// the same backend, before running the plan again (both are ordered on the backend's stream,
// so queueing is enough; no synchronisation is needed). The model must outlive its plans
// (the graph reads its weights in place). On backends without capture (the CPU), run() is the
// plain forward and returns a fresh tensor.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "engine/backends/backend.h"
#include "engine/models/vae/vae.h"

namespace latent {

enum class VaePart : uint8_t { kEncode, kDecode };
const char* vae_part_name(VaePart part);

struct PlanOptions {
  bool graph = true;           // capture a graph where the backend supports it
  bool require_graph = false;  // fail instead of falling back to the plain forward
  // The example itself becomes the graph's input buffer instead of a copy of it: the caller
  // writes each input into input() (the example's memory) and runs run(input()), which then
  // copies nothing. Without it the plan holds an input-sized buffer of its own beside the
  // caller's (+12 MiB at 1920x1088: what kept encoders above torch.compile's peak).
  bool adopt_input = false;
};

class PlannedPart {
 public:
  // Plans `part` of `model` for inputs shaped like `example` (a tensor on the model's backend,
  // whose contents only feed the warm-up). Fails if the part is missing or the forward fails;
  // a failed capture falls back to the plain forward with a warning unless
  // options.require_graph.
  static Result<std::unique_ptr<PlannedPart>> build(VaeModel& model, VaePart part,
                                                    const Tensor& example,
                                                    const PlanOptions& options = {});

  // Runs the part on `x` (same shape as planned, on the model's backend). See the file comment
  // for how long the returned tensor stays valid. `x` may be input() itself (no copy).
  Result<Tensor> run(const Tensor& x);
  // The graph's input buffer (undefined without a graph): an input written into it, on the
  // backend's stream after the previous run() was queued, is read in place by run(input()).
  const Tensor& input() const { return input_; }

  bool uses_graph() const { return graph_ != nullptr; }
  // Why a graph was wanted but the plan runs the plain forward (empty otherwise).
  const std::string& graph_failure() const { return graph_failure_; }
  // Whether run(x) takes `x` (shape, and with a graph its dtype, layout and device).
  bool accepts(const Tensor& x) const;
  VaePart part() const { return part_; }
  const Shape& input_shape() const { return input_shape_; }
  const Shape& output_shape() const { return output_shape_; }

 private:
  PlannedPart() = default;
  Result<Tensor> forward(const Tensor& x);
  // Captures forward(input_) -> output_; false (with the reason) when the backend refuses.
  Status capture();

  VaeModel* model_ = nullptr;
  VaePart part_ = VaePart::kDecode;
  Shape input_shape_, output_shape_;
  Tensor input_;   // the graph's input buffer (run() copies into it unless given it)
  Tensor output_;  // the graph's output buffer (run() returns it)
  std::shared_ptr<CapturedGraph> graph_;
  std::string graph_failure_;
};

// The plans of one model: one per (part, input shape), built on first use and kept until
// clear() (call it when the model or the negotiated shapes change for good).
class VaePlanner {
 public:
  explicit VaePlanner(VaeModel& model, PlanOptions options = {})
      : model_(&model), options_(options) {}

  // The plan for `part` at `example`'s shape, built now if there is none yet.
  Result<PlannedPart*> plan(VaePart part, const Tensor& example);
  // plan(part, x)->run(x).
  Result<Tensor> run(VaePart part, const Tensor& x);
  void clear() { plans_.clear(); }
  size_t size() const { return plans_.size(); }

 private:
  VaeModel* model_;
  PlanOptions options_;
  std::map<std::pair<VaePart, Shape>, std::unique_ptr<PlannedPart>> plans_;
};

}  // namespace latent
