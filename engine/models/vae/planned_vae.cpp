#include "engine/models/vae/planned_vae.h"

#include <utility>

#include "engine/core/log.h"

namespace latent {

const char* vae_part_name(VaePart part) { return part == VaePart::kEncode ? "encoder" : "decoder"; }

Result<Tensor> PlannedPart::forward(const Tensor& x) {
  // x: [N, 3, H, W] (encode) or [N, C, h, w] (decode)
  return part_ == VaePart::kEncode ? model_->encode(x) : model_->decode(x);
}

Result<std::unique_ptr<PlannedPart>> PlannedPart::build(VaeModel& model, VaePart part,
                                                        const Tensor& example,
                                                        const PlanOptions& options) {
  if (part == VaePart::kEncode ? !model.has_encoder() : !model.has_decoder())
    return Status::errorf("plan: the model ", model.info().source.given, " has no ",
                          vae_part_name(part));
  if (!example.defined()) return Status::errorf("plan ", vae_part_name(part), ": no example input");
  Backend& b = model.backend();
  if (example.device() != b.device())
    return Status::errorf("plan ", vae_part_name(part), ": example ", example.describe(),
                          " is not on ", b.name());
  std::unique_ptr<PlannedPart> p(new PlannedPart());
  p->model_ = &model;
  p->part_ = part;
  p->input_shape_ = example.shape();
  const std::string what =
      str_cat(vae_part_name(part), " plan for ", shape_str(example.shape()), " on ", b.name());

  // Warm-up: chooses (and times, once per shape and GPU) every convolution algorithm, and
  // leaves the buffer the graph will write its output into.
  Result<Tensor> warm = p->forward(example);
  if (!warm.ok()) return warm.status().with_context(what);
  p->output_ = std::move(warm).value();
  p->output_shape_ = p->output_.shape();

  if (!options.graph || !b.supports_capture()) {
    p->output_ = Tensor();
    LATENT_DEBUG(what, ": plain forward (", b.supports_capture() ? "graphs off" : "no graphs", ")");
    return p;
  }
  // The graph's input buffer: the example itself (adopt_input), else a copy of it (same shape,
  // dtype and layout).
  if (options.adopt_input) {
    p->input_ = example;
  } else {
    Result<Tensor> in = b.affine(example, 1.f, 0.f);
    if (!in.ok()) return in.status().with_context(what);
    p->input_ = std::move(in).value();
  }

  // One more plain run with its buffers' sizes and lifetimes recorded: the capture lays them out
  // by lifetime in one arena (the graph allocator's own layout held ~30 % more than a plain
  // run's working set: bench/NOTES.md, session 11). Its output is dropped inside the recording,
  // as the captured run's is.
  b.record_allocations(true);
  {
    Result<Tensor> again = p->forward(example);
    if (!again.ok()) {
      b.record_allocations(false);
      b.record_allocations(true);  // leave no recording behind for another capture
      b.record_allocations(false);
      return again.status().with_context(what);
    }
  }
  b.record_allocations(false);
  Status st = p->capture();
  if (!st.ok()) {
    // The arena did not fit the captured run (it allocated otherwise): capture once more with
    // the graph allocator's layout.
    LATENT_WARN(what, ": ", st.message(), "; capturing again without the arena");
    st = p->capture();
  }
  if (st.ok()) {
    // One replay now maps the graph's memory, so the first frame does not pay for it.
    st = b.replay(*p->graph_);
  }
  if (!st.ok()) {
    p->graph_.reset();
    p->input_ = Tensor();
    p->output_ = Tensor();
    if (options.require_graph) return st.with_context(what);
    p->graph_failure_ = st.message();
    LATENT_WARN(what, ": running without a graph: ", st.message());
    return p;
  }
  LATENT_DEBUG(what, ": captured as a graph");
  return p;
}

Status PlannedPart::capture() {
  Backend& b = model_->backend();
  LATENT_TRY(b.begin_capture());
  Status st = ok_status();
  {
    // Every tensor made while capturing must be dropped before end_capture(): its memory
    // belongs to the graph.
    Result<Tensor> y = forward(input_);
    if (!y.ok()) {
      st = y.status();
    } else if (y->shape() != output_shape_) {
      st = Status::errorf("the captured forward returned ", shape_str(y->shape()),
                          " where the warm-up returned ", shape_str(output_shape_));
    } else {
      st = b.copy_into(*y, output_);
    }
  }
  Result<std::shared_ptr<CapturedGraph>> g = b.end_capture();
  LATENT_TRY(st);
  if (!g.ok()) return g.status();
  graph_ = std::move(g).value();
  return ok_status();
}

bool PlannedPart::accepts(const Tensor& x) const {
  if (!x.defined() || x.shape() != input_shape_) return false;
  if (!graph_) return true;
  return x.dtype() == input_.dtype() && x.layout() == input_.layout() &&
         x.device() == input_.device();
}

Result<Tensor> PlannedPart::run(const Tensor& x) {
  if (!x.defined() || x.shape() != input_shape_)
    return Status::errorf(vae_part_name(part_), " plan for ", shape_str(input_shape_), " got ",
                          x.defined() ? shape_str(x.shape()) : std::string("no tensor"));
  if (!graph_) return forward(x);
  Backend& b = model_->backend();
  if (x.dtype() != input_.dtype() || x.layout() != input_.layout() || x.device() != input_.device())
    return Status::errorf(vae_part_name(part_), " plan for ", input_.describe(), " got ",
                          x.describe());
  if (x.data() != input_.data()) LATENT_TRY(b.copy_into(x, input_));
  LATENT_TRY(b.replay(*graph_));
  return output_;
}

Result<PlannedPart*> VaePlanner::plan(VaePart part, const Tensor& example) {
  if (!example.defined()) return Status::errorf("plan ", vae_part_name(part), ": no input");
  auto key = std::make_pair(part, example.shape());
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  LATENT_ASSIGN_OR_RETURN(std::unique_ptr<PlannedPart> p,
                          PlannedPart::build(*model_, part, example, options_));
  PlannedPart* raw = p.get();
  plans_.emplace(std::move(key), std::move(p));
  return raw;
}

Result<Tensor> VaePlanner::run(VaePart part, const Tensor& x) {
  LATENT_ASSIGN_OR_RETURN(PlannedPart * p, plan(part, x));
  return p->run(x);
}

}  // namespace latent
