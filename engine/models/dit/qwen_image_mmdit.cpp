// diffusers QwenImageTransformer2DModel; see qwen_image_mmdit.h for the network.
#include "engine/models/dit/qwen_image_mmdit.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "engine/core/env.h"
#include "engine/core/log.h"
#include "engine/weights/binder.h"

namespace latent {

namespace {

constexpr float kNormEps = 1e-6f;         // every LayerNorm / RMSNorm of the model
constexpr int kTimeProjDim = 256;         // Timesteps(num_channels=256)
constexpr int64_t kRopePositions = 4096;  // QwenEmbedRope precomputes positions [-4096, 4096)

// LATENT_LORA_FOLD=0 keeps every runtime LoRA's two GEMMs beside its layer (FoldedLoras below
// is the default; the switch is for timing one against the other).
bool lora_fold_enabled() { return env_choice("LATENT_LORA_FOLD", {{"1"}, {"0"}}, 0) == 0; }

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += str_cat(s.empty() ? "" : ", ", x);
  return s;
}

// The LoRAs of one linear layer at run time: the adapters' factors stacked, down [R, in] and up
// [out, R] (R = the sum of their ranks), up's columns of adapter i scaled by strength_i *
// alpha_i / rank_i; rebuilt when strengths change.
struct LinearLora {
  std::vector<size_t> which;  // index of each adapter's LoRA in the model's list
  std::vector<Tensor> ups;    // [out, r_i] unscaled, on the backend
  std::vector<float> scales;  // alpha_i / rank_i
  Tensor down;                // [R, in]
  Tensor up;                  // [out, R], scaled; undefined when every strength is 0
  // Folded into the layer's GEMM (FoldedLoras below): `up` stays undefined, the layer's weight
  // holds the up factors, its input's FoldedLoras the scaled down rows. `pad`: zero rows
  // [columns - R, in] that round the layer's block of columns up to a multiple of 8.
  bool folded = false;
  Tensor pad;

  // Rebuilds `up` for `strengths` (one per LoRA of the model).
  Status set_strengths(Backend& be, const std::vector<float>& strengths) {
    if (folded) return ok_status();  // FoldedLoras::set_strengths
    std::vector<Tensor> parts;
    bool any = false;
    for (size_t i = 0; i < ups.size(); ++i) {
      const float s = strengths[which[i]] * scales[i];
      any = any || s != 0.f;
      LATENT_ASSIGN_OR_RETURN(Tensor scaled, be.scaled_add(ups[i], ups[i], s, 0.f));
      parts.push_back(scaled);
    }
    up = Tensor();
    if (!any) return ok_status();
    if (parts.size() == 1) {
      up = parts[0];
      return ok_status();
    }
    LATENT_ASSIGN_OR_RETURN(up, be.concat(parts, 1));
    return ok_status();
  }
};

// The runtime LoRAs of the linear layers that read one input, folded into their GEMMs
// (backend.h, "Runtime LoRAs folded into the base GEMM"). The input's producer writes
// x' = [x | h]: `extra` more columns, member j's block of R_j (its adapters' ranks summed,
// rounded up to 8 so rows stay 16-byte aligned) at column in + c_j, then h = x down^T fills
// them (`down` [extra, in]: each member's adapters' down rows scaled by strength * alpha / rank,
// zero rows for the rounding). Member j's weight is held as W'_j = [W_j | 0 | up_j]
// ([out, in + c_j + R_j], up_j its adapters' up factors unscaled, zero columns for the
// rounding), so x'[..., :in + c_j + R_j] W'_j^T = x W_j^T + h_j up_j^T: the LoRA term is
// summed inside the base GEMM, whose output is written once, bias and GELU still in its
// epilogue. A strength change rebuilds `down` alone.
struct FoldedLoras {
  int64_t in = 0;                                    // columns of x
  int64_t extra = 0;                                 // columns of h
  std::vector<std::shared_ptr<LinearLora>> members;  // in column order
  Tensor down;                                       // [extra, in]

  Status set_strengths(Backend& be, const std::vector<float>& strengths) {
    std::vector<Tensor> parts;
    for (const auto& m : members) {
      int64_t row = 0;
      for (size_t i = 0; i < m->ups.size(); ++i) {
        const int64_t rank = m->ups[i].dim(1);
        LATENT_ASSIGN_OR_RETURN(Tensor d, be.slice(m->down, 0, row, rank));
        LATENT_ASSIGN_OR_RETURN(d, be.scaled_add(d, d, strengths[m->which[i]] * m->scales[i], 0.f));
        parts.push_back(std::move(d));
        row += rank;
      }
      if (m->pad.defined()) parts.push_back(m->pad);
    }
    if (parts.size() == 1) {
      down = parts[0];
      return ok_status();
    }
    LATENT_ASSIGN_OR_RETURN(down, be.concat(parts, 0));
    return ok_status();
  }
  // The producer's output [..., in + extra] with h written into its last `extra` columns.
  Result<Tensor> fill(Backend& be, const Tensor& wide) const {
    return be.linear_into_columns(wide, down, in);
  }
};

// An nn.Linear: weight [out, in], bias [out]; optionally LoRAs applied at run time. With
// LinearFormat::kFp8 the weight is held quantised (w8) instead of w.
struct Linear {
  Tensor w;
  Tensor b;
  std::shared_ptr<LinearLora> lora;
  Fp8Matrix w8;

  static Linear bind(WeightBinder& binder, const std::string& prefix, int64_t in, int64_t out) {
    return Linear{binder.take(prefix + ".weight", {out, in}), binder.take(prefix + ".bias", {out}),
                  nullptr, Fp8Matrix{}};
  }
  // w -> w8 (one scale per output channel); w is released. A failed bind (w undefined) is
  // left for the binder to report.
  Status quantize_fp8(Backend& be) {
    if (!w.defined() || w8.defined()) return ok_status();
    LATENT_ASSIGN_OR_RETURN(w8, be.fp8_quantize_rows(w));
    w = Tensor();
    return ok_status();
  }
  // x: [..., in] -> [..., out]. `xq`: x's rows already quantised (several FP8 layers reading
  // one input share it), else quantised here when the layer is FP8. x may be a wide input
  // [..., in + E] (FoldedLoras: this layer reads its first w.dim(1) columns, its own LoRA
  // folded into w); `extra` > 0 makes the output wide, [..., out + extra], for the next
  // layer's FoldedLoras to fill.
  Result<Tensor> operator()(Backend& be, const Tensor& x, DitActivation act = DitActivation::kNone,
                            const Fp8Matrix* xq = nullptr, int64_t extra = 0) const {
    const bool adapted = lora && lora->up.defined();
    if (w.defined() && (extra > 0 || x.dim(-1) != w.dim(1))) {
      if (adapted)
        return Status::error(
            "internal: a layer with an unfolded runtime LoRA reads or writes "
            "a wide input");
      return be.linear_wide(x, w, b, act, extra);
    }
    if (extra > 0) return Status::error("internal: an FP8 layer asked for a wide output");
    Tensor y;
    if (w8.defined()) {
      Fp8Matrix own;
      if (!xq || !xq->defined()) {
        LATENT_ASSIGN_OR_RETURN(own, be.fp8_quantize_rows(x));
        xq = &own;
      }
      LATENT_ASSIGN_OR_RETURN(y, be.linear_fp8(*xq, w8, b, adapted ? DitActivation::kNone : act));
    } else {
      LATENT_ASSIGN_OR_RETURN(y, be.linear(x, w, b, adapted ? DitActivation::kNone : act));
    }
    if (!adapted) return y;
    // act(x W^T + b + (x down^T) up^T): the low-rank path [..., in] -> [..., R] -> [..., out],
    // its up projection accumulated onto the base output (one GEMM on CUDA, activation fused).
    LATENT_ASSIGN_OR_RETURN(Tensor h, be.linear(x, lora->down, Tensor(), DitActivation::kNone));
    return be.linear_add(h, lora->up, y, act);
  }
  // An FP8 layer without a runtime LoRA: its product is the FP8 GEMM alone, so its output can be
  // written quantised-in (the attention's) or gated into a residual (gated_add()).
  bool plain_fp8() const { return w8.defined() && !(lora && lora->up.defined()); }
  // A plain_fp8() layer: residual + gate * (x W^T + b) as one op (Backend::linear_fp8_gated_add);
  // gate one row of `out` values.
  Result<Tensor> gated_add(Backend& be, const Tensor& x, const Fp8Matrix* xq, const Tensor& gate,
                           const Tensor& residual) const {
    Fp8Matrix own;
    if (!xq || !xq->defined()) {
      LATENT_ASSIGN_OR_RETURN(own, be.fp8_quantize_rows(x));
      xq = &own;
    }
    return be.linear_fp8_gated_add(*xq, w8, b, gate, residual);
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Config

Result<QwenImageMmditConfig> parse_qwen_image_mmdit_config(const Config& config) {
  const std::string cls = config.class_name();
  if (!cls.empty() && cls != "QwenImageTransformer2DModel")
    return Status::errorf(config.path(), ": _class_name is '", cls,
                          "', expected QwenImageTransformer2DModel");
  QwenImageMmditConfig c;
  LATENT_ASSIGN_OR_RETURN(c.patch_size, config.get_int("patch_size", c.patch_size));
  LATENT_ASSIGN_OR_RETURN(c.in_channels, config.get_int("in_channels", c.in_channels));
  const auto& j = config.json();
  if (j.contains("out_channels") && j["out_channels"].is_null()) {
    c.out_channels = c.in_channels;  // diffusers: out_channels or in_channels
  } else {
    LATENT_ASSIGN_OR_RETURN(c.out_channels, config.get_int("out_channels", c.out_channels));
  }
  LATENT_ASSIGN_OR_RETURN(c.num_layers, config.get_int("num_layers", c.num_layers));
  LATENT_ASSIGN_OR_RETURN(c.attention_head_dim,
                          config.get_int("attention_head_dim", c.attention_head_dim));
  LATENT_ASSIGN_OR_RETURN(c.num_attention_heads,
                          config.get_int("num_attention_heads", c.num_attention_heads));
  LATENT_ASSIGN_OR_RETURN(c.joint_attention_dim,
                          config.get_int("joint_attention_dim", c.joint_attention_dim));
  LATENT_ASSIGN_OR_RETURN(c.axes_dims_rope,
                          config.get_int_list("axes_dims_rope", c.axes_dims_rope));
  LATENT_ASSIGN_OR_RETURN(c.zero_cond_t, config.get_bool("zero_cond_t", false));
  LATENT_ASSIGN_OR_RETURN(bool guidance, config.get_bool("guidance_embeds", false));
  LATENT_ASSIGN_OR_RETURN(bool add_t, config.get_bool("use_additional_t_cond", false));
  LATENT_ASSIGN_OR_RETURN(bool layer3d, config.get_bool("use_layer3d_rope", false));
  const std::string& p = config.path();
  if (guidance)
    return Status::errorf(p,
                          ": guidance_embeds is true; diffusers' QwenImageTransformer2DModel "
                          "cannot run such a model either (its guidance path is unfinished)");
  if (add_t || layer3d)
    return Status::errorf(p,
                          ": use_additional_t_cond / use_layer3d_rope (Qwen-Image-Layered) "
                          "are not supported");
  for (auto [key, v] : {std::pair<const char*, int64_t>{"patch_size", c.patch_size},
                        {"in_channels", c.in_channels},
                        {"out_channels", c.out_channels},
                        {"num_layers", c.num_layers},
                        {"attention_head_dim", c.attention_head_dim},
                        {"num_attention_heads", c.num_attention_heads},
                        {"joint_attention_dim", c.joint_attention_dim}})
    if (v < 1 || v > (int64_t{1} << 20))
      return Status::errorf(p, ": '", key, "' is ", v, ", expected a size from 1 to ",
                            int64_t{1} << 20);
  if (c.axes_dims_rope.size() != 3)
    return Status::errorf(p,
                          ": 'axes_dims_rope' must list 3 axis sizes (frame, height, width), "
                          "got [",
                          join(c.axes_dims_rope), "]");
  int64_t sum = 0;
  for (int64_t a : c.axes_dims_rope) {
    if (a < 2 || a % 2 != 0)
      return Status::errorf(p, ": 'axes_dims_rope' [", join(c.axes_dims_rope),
                            "] must hold even positive sizes");
    sum += a;
  }
  if (sum != c.attention_head_dim)
    return Status::errorf(p, ": 'axes_dims_rope' [", join(c.axes_dims_rope), "] sums to ", sum,
                          " but attention_head_dim is ", c.attention_head_dim);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Rotary table and timestep projection

Result<Tensor> qwen_image_rope_table(const std::vector<int64_t>& axes_dims,
                                     const std::vector<ImageShape>& images, int64_t text_len) {
  if (axes_dims.size() != 3) return Status::error("rope: three axes expected");
  if (images.empty()) return Status::error("rope: no image shapes given");
  if (text_len < 0) return Status::error("rope: negative text length");
  // Inverse frequencies per axis as rope_params: 1 / theta^(arange(0, dim, 2) / dim), fp32.
  std::vector<std::vector<float>> inv(3);
  int64_t pairs = 0;
  for (int a = 0; a < 3; ++a) {
    const int64_t dim = axes_dims[a];
    for (int64_t k = 0; k < dim; k += 2) {
      const float e = static_cast<float>(k) / static_cast<float>(dim);
      inv[a].push_back(1.f / std::pow(10000.f, e));
    }
    pairs += dim / 2;
  }
  int64_t image_tokens = 0, max_vid_index = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const ImageShape& s = images[i];
    if (s.frames < 1 || s.height < 1 || s.width < 1)
      return Status::errorf("rope: image ", i, " has shape (", s.frames, ", ", s.height, ", ",
                            s.width, ") in patches; every side must be positive");
    if (static_cast<int64_t>(i) + s.frames > kRopePositions || s.height > kRopePositions ||
        s.width > kRopePositions)
      return Status::errorf("rope: image ", i, " (", s.frames, ", ", s.height, ", ", s.width,
                            ") exceeds QwenEmbedRope's ", kRopePositions, " positions");
    image_tokens += s.tokens();
    max_vid_index = std::max({max_vid_index, s.height / 2, s.width / 2});
  }
  if (max_vid_index + text_len > kRopePositions)
    return Status::errorf("rope: ", text_len, " text tokens after position ", max_vid_index,
                          " exceed QwenEmbedRope's ", kRopePositions, " positions");
  Tensor table = Tensor::empty({text_len + image_tokens, pairs, 2}, DType::kF32);
  float* out = table.data_as<float>();
  // One token: positions (frame, row, col) -> pairs x (cos, sin); angle = float(pos) * inv, fp32.
  auto put = [&](int64_t token, const int64_t pos[3]) {
    float* row = out + token * pairs * 2;
    for (int a = 0; a < 3; ++a)
      for (float f : inv[a]) {
        const float angle = static_cast<float>(pos[a]) * f;
        *row++ = static_cast<float>(std::cos(static_cast<double>(angle)));
        *row++ = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
  };
  for (int64_t j = 0; j < text_len; ++j) {
    const int64_t pos[3] = {max_vid_index + j, max_vid_index + j, max_vid_index + j};
    put(j, pos);
  }
  int64_t token = text_len;
  for (size_t i = 0; i < images.size(); ++i) {
    const ImageShape& s = images[i];
    // scale_rope: rows -(h - h/2) .. h/2 - 1, columns likewise; frames from the image index.
    for (int64_t f = 0; f < s.frames; ++f)
      for (int64_t y = 0; y < s.height; ++y)
        for (int64_t x = 0; x < s.width; ++x) {
          const int64_t pos[3] = {static_cast<int64_t>(i) + f, y - (s.height - s.height / 2),
                                  x - (s.width - s.width / 2)};
          put(token++, pos);
        }
  }
  return table;
}

Tensor qwen_image_timestep_proj(const std::vector<float>& timesteps) {
  // -> [n, 256]: [cos | sin] (flip_sin_to_cos) of t * 1000 * exp(-ln(10000) k / 128), in fp32
  const int half = kTimeProjDim / 2;
  const auto n = static_cast<int64_t>(timesteps.size());
  Tensor t = Tensor::empty({n, kTimeProjDim}, DType::kF32);
  float* p = t.data_as<float>();
  const float neg_log = static_cast<float>(-std::log(10000.0));
  for (int64_t i = 0; i < n; ++i)
    for (int k = 0; k < half; ++k) {
      const float freq = std::exp(neg_log * static_cast<float>(k) / static_cast<float>(half));
      const float arg = 1000.f * (timesteps[i] * freq);
      p[i * kTimeProjDim + k] = static_cast<float>(std::cos(static_cast<double>(arg)));
      p[i * kTimeProjDim + half + k] = static_cast<float>(std::sin(static_cast<double>(arg)));
    }
  return t;
}

TextPadding qwen_image_text_padding(const std::vector<float>& mask, int64_t batch, int64_t t_txt) {
  TextPadding pad;
  pad.kept = t_txt;
  if (mask.empty()) {
    pad.prefix = true;
    pad.lengths.assign(static_cast<size_t>(batch), t_txt);
    return pad;
  }
  if (static_cast<int64_t>(mask.size()) != batch * t_txt) return pad;  // forward() rejects it
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const float* row = mask.data() + b * t_txt;
    int64_t len = 0;
    while (len < t_txt && row[len] != 0.f) ++len;
    for (int64_t j = len; j < t_txt; ++j)
      if (row[j] != 0.f) {
        pad.lengths.clear();
        return pad;  // a hole: keep everything
      }
    pad.lengths.push_back(len);
    longest = std::max(longest, len);
  }
  pad.prefix = true;
  // At least one text token: the streams keep their shapes (its key stays masked if padding).
  pad.kept = std::max<int64_t>(longest, std::min<int64_t>(t_txt, 1));
  return pad;
}

// ---------------------------------------------------------------------------------------------
// Weights

namespace {

// QwenImageTransformerBlock: the parameters of one dual-stream block.
struct Block {
  Linear img_mod, txt_mod;                 // [6D, D]: shift, scale, gate for attn and MLP
  Linear to_q, to_k, to_v, to_out;         // image stream
  Linear add_q, add_k, add_v, to_add_out;  // text stream
  Tensor norm_q, norm_k, norm_added_q, norm_added_k;        // [head_dim]
  // LATENT_FP8_ATTENTION=codes: bounds of |q| and |k| after the per-head RMS norm and rope,
  // sqrt(head_dim) x the largest |gamma| of the two streams (0: not computed).
  float q_bound = 0.f, k_bound = 0.f;
  Linear img_mlp_in, img_mlp_out, txt_mlp_in, txt_mlp_out;  // D -> 4D (GELU tanh) -> D
  // Runtime LoRAs folded into the GEMMs, per input (null: none, or not folded): the normalised
  // inputs of q/k/v and of the MLPs, the attention's output (image / text rows), and the MLPs'
  // hidden activations.
  std::shared_ptr<FoldedLoras> fold_qkv, fold_add_qkv, fold_img_mlp_in, fold_txt_mlp_in, fold_out,
      fold_add_out, fold_img_mlp_out, fold_txt_mlp_out;

  static Block bind(WeightBinder& b, const std::string& p, const QwenImageMmditConfig& c) {
    const int64_t d = c.inner_dim(), hd = c.attention_head_dim;
    Block k;
    k.img_mod = Linear::bind(b, p + ".img_mod.1", d, 6 * d);
    k.txt_mod = Linear::bind(b, p + ".txt_mod.1", d, 6 * d);
    k.to_q = Linear::bind(b, p + ".attn.to_q", d, d);
    k.to_k = Linear::bind(b, p + ".attn.to_k", d, d);
    k.to_v = Linear::bind(b, p + ".attn.to_v", d, d);
    k.to_out = Linear::bind(b, p + ".attn.to_out.0", d, d);
    k.add_q = Linear::bind(b, p + ".attn.add_q_proj", d, d);
    k.add_k = Linear::bind(b, p + ".attn.add_k_proj", d, d);
    k.add_v = Linear::bind(b, p + ".attn.add_v_proj", d, d);
    k.to_add_out = Linear::bind(b, p + ".attn.to_add_out", d, d);
    k.norm_q = b.take(p + ".attn.norm_q.weight", {hd});
    k.norm_k = b.take(p + ".attn.norm_k.weight", {hd});
    k.norm_added_q = b.take(p + ".attn.norm_added_q.weight", {hd});
    k.norm_added_k = b.take(p + ".attn.norm_added_k.weight", {hd});
    k.img_mlp_in = Linear::bind(b, p + ".img_mlp.net.0.proj", d, 4 * d);
    k.img_mlp_out = Linear::bind(b, p + ".img_mlp.net.2", 4 * d, d);
    k.txt_mlp_in = Linear::bind(b, p + ".txt_mlp.net.0.proj", d, 4 * d);
    k.txt_mlp_out = Linear::bind(b, p + ".txt_mlp.net.2", 4 * d, d);
    return k;
  }
  // The 14 linear layers (what LinearFormat::kFp8 quantises).
  std::vector<Linear*> linears() {
    return {&img_mod, &txt_mod, &to_q,   &to_k,       &to_v,        &to_out,     &add_q,
            &add_k,   &add_v,   &to_add_out, &img_mlp_in, &img_mlp_out, &txt_mlp_in, &txt_mlp_out};
  }
  std::vector<std::shared_ptr<FoldedLoras>*> folds() {
    return {&fold_qkv, &fold_add_qkv, &fold_img_mlp_in,  &fold_txt_mlp_in,
            &fold_out, &fold_add_out, &fold_img_mlp_out, &fold_txt_mlp_out};
  }
};

// Zeros [rows, cols] on the backend.
Result<Tensor> zeros(Backend& be, int64_t rows, int64_t cols) {
  return be.upload(Tensor::zeros({rows, cols}, DType::kF32));
}

// Folds the runtime LoRAs of `layers` (which read one input) into their GEMMs (FoldedLoras);
// null when none of them has a LoRA, or when one of them (or the input's `producer`, a linear
// layer, if any) is held in FP8: those keep the LoRA's two GEMMs beside the layer.
Result<std::shared_ptr<FoldedLoras>> fold_loras(Backend& be, const std::vector<Linear*>& layers,
                                                const Linear* producer) {
  if (producer && !producer->w.defined()) return std::shared_ptr<FoldedLoras>();
  bool any = false;
  for (const Linear* l : layers) {
    if (!l->w.defined()) return std::shared_ptr<FoldedLoras>();
    any = any || l->lora;
  }
  if (!any) return std::shared_ptr<FoldedLoras>();
  auto f = std::make_shared<FoldedLoras>();
  f->in = layers[0]->w.dim(1);
  for (Linear* l : layers) {
    if (!l->lora) continue;
    LinearLora& r = *l->lora;
    const int64_t out = l->w.dim(0), rank = r.down.dim(0);
    const int64_t cols = (rank + 7) / 8 * 8;
    std::vector<Tensor> parts = {l->w};
    if (f->extra > 0) {
      LATENT_ASSIGN_OR_RETURN(Tensor z, zeros(be, out, f->extra));
      parts.push_back(std::move(z));
    }
    for (const Tensor& u : r.ups) parts.push_back(u);
    if (cols > rank) {
      LATENT_ASSIGN_OR_RETURN(Tensor z, zeros(be, out, cols - rank));
      parts.push_back(std::move(z));
      LATENT_ASSIGN_OR_RETURN(r.pad, zeros(be, cols - rank, f->in));
    }
    LATENT_ASSIGN_OR_RETURN(l->w, be.concat(parts, 1));  // W' = [W | 0 | up | 0]
    r.folded = true;
    r.up = Tensor();
    f->members.push_back(l->lora);
    f->extra += cols;
  }
  return f;
}

}  // namespace

struct QwenImageMmdit::Weights {
  Linear img_in;          // [D, in_channels]
  Tensor txt_norm;        // [joint_attention_dim]
  Linear txt_in;          // [D, joint_attention_dim]
  Linear time_1, time_2;  // time_text_embed.timestep_embedder: 256 -> D (SiLU) -> D
  std::vector<Block> blocks;
  Linear norm_out;  // AdaLayerNormContinuous.linear: [2D, D], scale then shift
  Linear proj_out;  // [p*p*out, D]
};

struct QwenImageMmdit::RuntimeLora : LinearLora {};

namespace {

// transformer_blocks.<i> for the largest i, + 1 (0 when there are none).
int64_t count_blocks(const WeightStore& store, const std::string& key_prefix) {
  int64_t layers = 0;
  const std::string prefix = key_prefix + "transformer_blocks.";
  for (const std::string& n : store.names()) {
    if (n.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t dot = n.find('.', prefix.size());
    const std::string idx = n.substr(prefix.size(), dot - prefix.size());
    if (idx.empty() || idx.size() > 7 || idx.find_first_not_of("0123456789") != std::string::npos)
      continue;
    layers = std::max<int64_t>(layers, std::stoll(idx) + 1);
  }
  return layers;
}

// The sizes of config.json that set how much is built (layers, widths), checked against the
// weights' shapes before anything is: a config of another model, or a typo such as num_layers
// 1000000, is named here instead of building a million blocks that each report missing tensors.
Status check_config_against_weights(const QwenImageMmditConfig& c, const std::string& config_path,
                                    const WeightStore& store, const std::string& key_prefix) {
  auto mismatch = [&](const char* key, int64_t given, const std::string& held) {
    return Status::errorf(config_path, ": '", key, "' is ", given, " but the weights in ",
                          store.path(), " ", held, ": the config does not describe these weights");
  };
  const int64_t layers = count_blocks(store, key_prefix);
  if (layers > 0 && c.num_layers != layers)
    return mismatch("num_layers", c.num_layers, str_cat("hold ", layers, " transformer_blocks"));
  if (const TensorRecord* r = store.find(key_prefix + "img_in.weight"); r && r->shape.size() == 2) {
    if (c.in_channels != r->shape[1])
      return mismatch("in_channels", c.in_channels,
                      str_cat("take ", r->shape[1], " (img_in.weight ", shape_str(r->shape), ")"));
    if (c.inner_dim() != r->shape[0])
      return Status::errorf(config_path, ": num_attention_heads x attention_head_dim is ",
                            c.num_attention_heads, " x ", c.attention_head_dim, " = ",
                            c.inner_dim(), " but the weights in ", store.path(), " have ",
                            r->shape[0], " (img_in.weight ", shape_str(r->shape),
                            "): the config does not describe these weights");
  }
  if (const TensorRecord* r = store.find(key_prefix + "txt_in.weight"); r && r->shape.size() == 2)
    if (c.joint_attention_dim != r->shape[1])
      return mismatch("joint_attention_dim", c.joint_attention_dim,
                      str_cat("take ", r->shape[1], " (txt_in.weight ", shape_str(r->shape), ")"));
  return ok_status();
}

}  // namespace

std::string qwen_image_mmdit_key_prefix(const WeightStore& store) {
  for (const char* prefix : {"model.diffusion_model.", "diffusion_model."})
    if (store.contains(str_cat(prefix, "img_in.weight"))) return prefix;
  return "";
}

Result<QwenImageMmditConfig> infer_qwen_image_mmdit_config(const WeightStore& store,
                                                           const std::string& prefix) {
  auto matrix = [&](const std::string& name, int rank) -> Result<Shape> {
    const TensorRecord* r = store.find(prefix + name);
    if (!r)
      return Status::errorf(store.path(), " has no '", prefix + name,
                            "': not a Qwen-Image transformer (QwenImageTransformer2DModel) "
                            "checkpoint");
    if (static_cast<int>(r->shape.size()) != rank)
      return Status::errorf(store.path(), ": '", prefix + name, "' has shape ", shape_str(r->shape),
                            ", not that of a Qwen-Image transformer");
    return r->shape;
  };
  LATENT_ASSIGN_OR_RETURN(Shape img_in, matrix("img_in.weight", 2));
  LATENT_ASSIGN_OR_RETURN(Shape txt_in, matrix("txt_in.weight", 2));
  LATENT_ASSIGN_OR_RETURN(Shape proj_out, matrix("proj_out.weight", 2));
  LATENT_ASSIGN_OR_RETURN(Shape norm_q, matrix("transformer_blocks.0.attn.norm_q.weight", 1));
  const int64_t d = img_in[0], hd = norm_q[0];
  const std::string what = str_cat(store.path(), " (no config.json: sizes from the weights)");
  if (hd < 1 || d % hd != 0)
    return Status::errorf(what, ": the inner dim ", d,
                          " (img_in.weight) is no multiple of the "
                          "head dim ",
                          hd, " (attn.norm_q.weight)");
  // Qwen-Image's patch size; out_channels follows from proj_out [p * p * out, D].
  const int64_t patch = 2;
  if (proj_out[0] % (patch * patch) != 0)
    return Status::errorf(what, ": proj_out.weight ", shape_str(proj_out),
                          " is no 2x2 patch of channels");
  // The rotary axes are no tensor's shape: Qwen-Image's own split of its 128-dim heads.
  if (hd != 128)
    return Status::errorf(what, ": heads of ", hd,
                          " dims need their axes_dims_rope; put the transformer's config.json "
                          "beside the file under the file's name (x.safetensors -> x.json)");
  nlohmann::json j = {{"_class_name", "QwenImageTransformer2DModel"},
                      {"patch_size", patch},
                      {"in_channels", img_in[1]},
                      {"out_channels", proj_out[0] / (patch * patch)},
                      {"num_layers", count_blocks(store, prefix)},
                      {"attention_head_dim", hd},
                      {"num_attention_heads", d / hd},
                      {"joint_attention_dim", txt_in[1]},
                      {"axes_dims_rope", {16, 56, 56}}};
  return parse_qwen_image_mmdit_config(Config(std::move(j), what));
}

QwenImageMmdit::~QwenImageMmdit() = default;

namespace {

// Every linear layer of the weights by its diffusers module name (lora.h's targets).
std::map<std::string, Linear*> linear_index(QwenImageMmdit::Weights& w);

}  // namespace

Result<std::unique_ptr<QwenImageMmdit>> QwenImageMmdit::load(const std::string& path,
                                                             std::shared_ptr<Backend> backend,
                                                             const MmditLoras& loras,
                                                             LinearFormat linears) {
  LATENT_ASSIGN_OR_RETURN(ModelSource source, resolve_model_source(path, "transformer"));
  return load(source, std::move(backend), loras, linears);
}

Result<std::unique_ptr<QwenImageMmdit>> QwenImageMmdit::load(const ModelSource& source,
                                                             std::shared_ptr<Backend> backend,
                                                             const MmditLoras& loras,
                                                             LinearFormat linears) {
  const std::string where = source.given.empty() ? source.root : source.given;
  if (!backend) return Status::errorf("loading ", where, ": no backend");
  const bool fp8 = linears == LinearFormat::kFp8;
  if (fp8 && !backend->supports_fp8_linear() && !backend->device().is_cpu())
    return Status::errorf("loading ", where, ": dtype fp8 needs FP8 matrix multiplication with ",
                          "per-row scales, which ", backend->name(),
                          " does not have (CUDA: Hopper, compute capability 9.0); use bf16");
  if (source.config_path.empty() && !source.single_file)
    return Status::errorf("loading ", where,
                          ": a QwenImageTransformer2DModel needs its "
                          "config.json (a diffusers transformer/ folder or pipeline root)");
  LATENT_ASSIGN_OR_RETURN(WeightStore store, WeightStore::open(source.weights_path));
  // ComfyUI's single files prefix the diffusers names.
  const std::string prefix = qwen_image_mmdit_key_prefix(store);
  QwenImageMmditConfig cfg;
  if (!source.config_path.empty()) {
    LATENT_ASSIGN_OR_RETURN(Config config, Config::load(source.config_path));
    LATENT_ASSIGN_OR_RETURN(cfg, parse_qwen_image_mmdit_config(config));
    LATENT_TRY(check_config_against_weights(cfg, source.config_path, store, prefix));
  } else {
    LATENT_ASSIGN_OR_RETURN(cfg, infer_qwen_image_mmdit_config(store, prefix));
  }

  std::unique_ptr<QwenImageMmdit> m(new QwenImageMmdit());
  m->config_ = cfg;
  m->source_ = source;
  m->backend_ = backend;
  m->w_ = std::make_unique<Weights>();
  Weights& w = *m->w_;
  const int64_t d = cfg.inner_dim();
  std::function<std::string(const std::string&)> rename;
  if (!prefix.empty()) rename = [prefix](const std::string& n) { return prefix + n; };
  WeightBinder binder(store, *backend, rename);
  w.img_in = Linear::bind(binder, "img_in", cfg.in_channels, d);
  w.txt_norm = binder.take("txt_norm.weight", {cfg.joint_attention_dim});
  w.txt_in = Linear::bind(binder, "txt_in", cfg.joint_attention_dim, d);
  w.time_1 = Linear::bind(binder, "time_text_embed.timestep_embedder.linear_1", kTimeProjDim, d);
  w.time_2 = Linear::bind(binder, "time_text_embed.timestep_embedder.linear_2", d, d);
  // FP8 without merged LoRAs: each block quantised as soon as it is bound, so the device never
  // holds more than one block in the compute dtype (a merge needs the compute-dtype weights:
  // then after apply_loras).
  const bool quantize_early = fp8 && (loras.specs.empty() || loras.mode != LoraMode::kMerged);
  m->linear_format_ = linears;
  // NAME=0 / 1 sets *flag; another value is warned about and leaves it.
  auto env_switch = [](const char* name, bool* flag) {
    *flag = env_choice(name, {{"0"}, {"1"}}, *flag ? 1 : 0) == 1;
  };
  env_switch("LATENT_DIT_GRAPHS", &m->graphs_enabled_);
  env_switch("LATENT_DIT_MOD_CACHE", &m->mod_cache_enabled_);
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    w.blocks.push_back(Block::bind(binder, str_cat("transformer_blocks.", i), cfg));
    if (quantize_early) LATENT_TRY(m->quantize_block(static_cast<size_t>(i)));
  }
  w.norm_out = Linear::bind(binder, "norm_out.linear", d, 2 * d);
  w.proj_out = Linear::bind(binder, "proj_out", d, cfg.out_features());
  LATENT_TRY(binder.finish().with_context(
      str_cat("loading QwenImageTransformer2DModel from ", source.weights_path)));
  m->parameters_ = binder.parameters_taken();
  m->storage_dtypes_ = binder.storage_dtypes();
  LATENT_TRY(m->apply_loras(loras));
  if (fp8 && !quantize_early) LATENT_TRY(m->quantize_linears());
  // LATENT_FP8_ATTENTION: 0 attention in the compute dtype, 1 FP8 attention with q, k and v
  // quantised by their amax, codes (the default with FP8 layers) q and k coded by joint_qk with
  // static bounds: |x| <= sqrt(d) max|gamma| after an RMS norm with gamma and a rotation of pairs.
  // (The backend's dit_attention_fp8 reads the same switch: fp8_attention_from_env.)
  m->fp8_qk_codes_ = fp8 && fp8_attention_from_env() == Fp8Attention::kCodes;
  if (m->fp8_qk_codes_) {
    // 0 where the gammas hold no finite nonzero value: that block's q and k are then scaled by
    // their amax (LATENT_FP8_ATTENTION=1's path; block_forward checks the bounds).
    auto bound = [&](const Tensor& a, const Tensor& b) -> Result<float> {
      float most = 0.f;
      for (const Tensor* g : {&a, &b}) {
        LATENT_ASSIGN_OR_RETURN(Tensor h, backend->download(*g));
        for (float x : h.to_floats()) most = std::max(most, std::fabs(x));
      }
      if (!(most > 0.f) || !std::isfinite(most)) return 0.f;
      // (1 + 2^-7): room for the norm's and the rotation's rounding
      return std::sqrt(static_cast<float>(cfg.attention_head_dim)) * most * (1.f + 1.f / 128.f);
    };
    int unbounded = 0;
    for (size_t i = 0; i < w.blocks.size(); ++i) {
      Block& blk = w.blocks[i];
      LATENT_ASSIGN_OR_RETURN(blk.q_bound, bound(blk.norm_q, blk.norm_added_q));
      LATENT_ASSIGN_OR_RETURN(blk.k_bound, bound(blk.norm_k, blk.norm_added_k));
      unbounded += blk.q_bound > 0.f && blk.k_bound > 0.f ? 0 : 1;
    }
    if (unbounded > 0)
      LATENT_WARN(unbounded, " of ", w.blocks.size(),
                  " blocks have a QK-norm gamma with no finite nonzero value: their q and k are "
                  "scaled by their amax (as with LATENT_FP8_ATTENTION=1)");
  }
  LATENT_INFO("loaded QwenImageTransformer2DModel (", cfg.num_layers, " layers, ",
              cfg.num_attention_heads, " x ", cfg.attention_head_dim, " heads",
              cfg.zero_cond_t ? ", zero_cond_t" : "", ") from ", where, " onto ", backend->name(),
              loras.specs.empty() ? ""
                                  : str_cat(" with ", loras.specs.size(), " LoRA(s), ",
                                            lora_mode_name(loras.mode)),
              fp8 ? str_cat(", ", m->fp8_layers_, " linear layers in fp8 e4m3",
                            backend->supports_fp8_linear() ? "" : " (emulated)")
                  : "");
  return m;
}

namespace {

std::map<std::string, Linear*> linear_index(QwenImageMmdit::Weights& w) {
  std::map<std::string, Linear*> index = {
      {"img_in", &w.img_in},
      {"txt_in", &w.txt_in},
      {"time_text_embed.timestep_embedder.linear_1", &w.time_1},
      {"time_text_embed.timestep_embedder.linear_2", &w.time_2},
      {"norm_out.linear", &w.norm_out},
      {"proj_out", &w.proj_out},
  };
  for (size_t i = 0; i < w.blocks.size(); ++i) {
    Block& k = w.blocks[i];
    const std::string p = str_cat("transformer_blocks.", i, ".");
    for (auto [name, lin] : std::initializer_list<std::pair<const char*, Linear*>>{
             {"img_mod.1", &k.img_mod},
             {"txt_mod.1", &k.txt_mod},
             {"attn.to_q", &k.to_q},
             {"attn.to_k", &k.to_k},
             {"attn.to_v", &k.to_v},
             {"attn.to_out.0", &k.to_out},
             {"attn.add_q_proj", &k.add_q},
             {"attn.add_k_proj", &k.add_k},
             {"attn.add_v_proj", &k.add_v},
             {"attn.to_add_out", &k.to_add_out},
             {"img_mlp.net.0.proj", &k.img_mlp_in},
             {"img_mlp.net.2", &k.img_mlp_out},
             {"txt_mlp.net.0.proj", &k.txt_mlp_in},
             {"txt_mlp.net.2", &k.txt_mlp_out}})
      index[p + name] = lin;
  }
  return index;
}

// A host matrix [r, c] fp32 -> its transpose [c, r].
Tensor transposed(const Tensor& m) {
  const int64_t r = m.dim(0), c = m.dim(1);
  Tensor t = Tensor::empty({c, r}, DType::kF32);
  const float* src = m.data_as<float>();
  float* dst = t.data_as<float>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) dst[j * r + i] = src[i * c + j];
  return t;
}

}  // namespace

Status QwenImageMmdit::apply_loras(const MmditLoras& loras) {
  loras_ = loras.specs;
  lora_mode_ = loras.mode;
  if (loras.specs.empty()) return ok_status();
  Backend& be = *backend_;
  auto index = linear_index(*w_);
  const auto targets = qwen_image_lora_targets(config_);
  if (index.size() != targets.size())
    return Status::errorf("internal: ", index.size(), " linear layers indexed, ", targets.size(),
                          " LoRA targets");
  std::map<Linear*, std::shared_ptr<RuntimeLora>> runtime;
  for (size_t li = 0; li < loras.specs.size(); ++li) {
    const LoraSpec& spec = loras.specs[li];
    const std::string what = str_cat("LoRA ", spec.path);
    if (!std::isfinite(spec.strength))
      return Status::errorf(what, ": strength ", spec.strength, " is not finite");
    LATENT_ASSIGN_OR_RETURN(LoraFile file, load_lora_file(spec.path));
    LATENT_TRY(check_lora_fits(file, config_));
    for (const LoraModule& mod : file.modules) {
      Linear* lin = index.at(mod.module);
      if (loras.mode == LoraMode::kMerged) {
        if (spec.strength == 0.f) continue;
        // W' = W + strength * (alpha / rank) * up @ down; up @ down = linear(up, down^T).
        LATENT_ASSIGN_OR_RETURN(Tensor up, be.upload(mod.up));
        LATENT_ASSIGN_OR_RETURN(Tensor down_t, be.upload(transposed(mod.down)));
        LATENT_ASSIGN_OR_RETURN(Tensor delta,
                                be.linear(up, down_t, Tensor(), DitActivation::kNone));
        LATENT_ASSIGN_OR_RETURN(lin->w,
                                be.scaled_add(lin->w, delta, 1.f, spec.strength * mod.scale()));
      } else {
        auto& r = runtime[lin];
        if (!r) r = std::make_shared<RuntimeLora>();
        LATENT_ASSIGN_OR_RETURN(Tensor down, be.upload(mod.down));
        LATENT_ASSIGN_OR_RETURN(Tensor up, be.upload(mod.up));
        r->which.push_back(li);
        r->ups.push_back(up);
        r->scales.push_back(mod.scale());
        if (r->down.defined()) {
          LATENT_ASSIGN_OR_RETURN(r->down, be.concat({r->down, down}, 0));
        } else {
          r->down = down;
        }
      }
    }
    LATENT_INFO(what, ": ", lora_layout_name(file.layout), ", ", file.modules.size(),
                " modules, rank ", file.rank_summary(), ", strength ", spec.strength, ", ",
                lora_mode_name(loras.mode));
  }
  for (auto& [lin, r] : runtime) {
    lin->lora = r;
    runtime_loras_.push_back(r);
  }
  if (loras.mode == LoraMode::kRuntime) {
    if (lora_fold_enabled()) {
      for (Block& b : w_->blocks) {
        LATENT_ASSIGN_OR_RETURN(b.fold_qkv, fold_loras(be, {&b.to_q, &b.to_k, &b.to_v}, nullptr));
        LATENT_ASSIGN_OR_RETURN(b.fold_add_qkv,
                                fold_loras(be, {&b.add_q, &b.add_k, &b.add_v}, nullptr));
        LATENT_ASSIGN_OR_RETURN(b.fold_img_mlp_in, fold_loras(be, {&b.img_mlp_in}, nullptr));
        LATENT_ASSIGN_OR_RETURN(b.fold_txt_mlp_in, fold_loras(be, {&b.txt_mlp_in}, nullptr));
        LATENT_ASSIGN_OR_RETURN(b.fold_out, fold_loras(be, {&b.to_out}, nullptr));
        LATENT_ASSIGN_OR_RETURN(b.fold_add_out, fold_loras(be, {&b.to_add_out}, nullptr));
        LATENT_ASSIGN_OR_RETURN(b.fold_img_mlp_out,
                                fold_loras(be, {&b.img_mlp_out}, &b.img_mlp_in));
        LATENT_ASSIGN_OR_RETURN(b.fold_txt_mlp_out,
                                fold_loras(be, {&b.txt_mlp_out}, &b.txt_mlp_in));
      }
    }
    for (const auto& r : runtime_loras_) folded_lora_layers_ += r->folded;
    if (!runtime_loras_.empty())
      LATENT_INFO("runtime LoRAs on ", runtime_loras_.size(), " linear layers, ",
                  folded_lora_layers_, " of them folded into the layer's GEMM",
                  lora_fold_enabled() ? "" : " (LATENT_LORA_FOLD=0)");
    std::vector<float> strengths;
    for (const auto& s : loras.specs) strengths.push_back(s.strength);
    LATENT_TRY(set_runtime_strengths(strengths));
  }
  return be.synchronize();
}

Status QwenImageMmdit::set_runtime_strengths(const std::vector<float>& strengths) {
  for (auto& r : runtime_loras_) LATENT_TRY(r->set_strengths(*backend_, strengths));
  for (Block& b : w_->blocks)
    for (std::shared_ptr<FoldedLoras>* f : b.folds())
      if (*f) LATENT_TRY((*f)->set_strengths(*backend_, strengths));
  return ok_status();
}

Status QwenImageMmdit::quantize_block(size_t i) {
  for (Linear* lin : w_->blocks[i].linears()) {
    LATENT_TRY(lin->quantize_fp8(*backend_).with_context(
        str_cat("quantising transformer_blocks.", i, " to fp8")));
    fp8_layers_ += lin->w8.defined();
  }
  return ok_status();
}

Status QwenImageMmdit::quantize_linears() {
  for (size_t i = 0; i < w_->blocks.size(); ++i) LATENT_TRY(quantize_block(i));
  return backend_->synchronize();
}

Status QwenImageMmdit::set_lora_strengths(const std::vector<float>& strengths) {
  if (lora_mode_ != LoraMode::kRuntime)
    return Status::error(
        "LoRA strengths are merged into the weights (lora-mode merged); reload the model to "
        "change them, or load with lora-mode runtime");
  if (strengths.size() != loras_.size())
    return Status::errorf(strengths.size(), " LoRA strengths given for ", loras_.size(), " LoRAs");
  for (float s : strengths)
    if (!std::isfinite(s)) return Status::errorf("LoRA strength ", s, " is not finite");
  bool same = true;
  for (size_t i = 0; i < strengths.size(); ++i) same = same && loras_[i].strength == strengths[i];
  if (same) return ok_status();
  graphs_.clear();  // they read the old low-rank factors
  mods_.clear();    // the modulation layers may carry LoRAs too
  LATENT_TRY(set_runtime_strengths(strengths));
  for (size_t i = 0; i < strengths.size(); ++i) loras_[i].strength = strengths[i];
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Forward graphs

struct QwenImageMmdit::ForwardGraph {
  ForwardKey key;
  int plain_runs = 0;   // the first forward of a shape runs plainly (plans chosen, caches filled)
  bool failed = false;  // capture refused: this shape runs plainly
  Tensor in_hs, in_ehs, in_proj, in_mods, out;  // the graph's own input and output buffers
  std::shared_ptr<CapturedGraph> graph;
};

bool QwenImageMmdit::ForwardKey::matches(const ForwardKey& o) const {
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.defined() == b.defined() && (!a.defined() || a.data() == b.data());
  };
  return hs == o.hs && ehs == o.ehs && proj == o.proj && mods == o.mods && t_run == o.t_run &&
         img_groups == o.img_groups && key_lengths == o.key_lengths && same(rope, o.rope) &&
         same(key_mask, o.key_mask);
}

void QwenImageMmdit::set_forward_graphs(bool on) {
  graphs_enabled_ = on;
  if (!on) graphs_.clear();
}

Status QwenImageMmdit::capture_forward(ForwardGraph& g, const ForwardBody& body, const Tensor& hs,
                                       const Tensor& ehs, const Tensor& proj, const Tensor& mods,
                                       const Tensor& example_out) {
  Backend& be = *backend_;
  // Buffers of the graph's own, made before the capture (so they are not graph memory) as
  // device copies (no host transfer): the inputs copied in before each replay, the output
  // copied out after.
  LATENT_ASSIGN_OR_RETURN(g.in_hs, be.concat({hs}, 0));
  LATENT_ASSIGN_OR_RETURN(g.in_ehs, be.concat({ehs}, 0));
  LATENT_ASSIGN_OR_RETURN(g.in_proj, be.concat({proj}, 0));
  if (mods.defined()) {
    LATENT_ASSIGN_OR_RETURN(g.in_mods, be.concat({mods}, 0));
  }
  LATENT_ASSIGN_OR_RETURN(g.out, be.concat({example_out}, 0));
  const Shape out_shape = example_out.shape();
  LATENT_TRY(be.begin_capture());
  Status st = ok_status();
  {
    // Every tensor made while capturing is graph memory: none outlives this scope.
    Result<Tensor> y = body(g.in_hs, g.in_ehs, g.in_proj, g.in_mods);
    if (!y.ok()) {
      st = y.status();
    } else if (y->shape() != out_shape) {
      st = Status::errorf("the captured forward returned ", shape_str(y->shape()), ", expected ",
                          shape_str(out_shape));
    } else {
      st = be.copy_into(*y, g.out);
    }
  }
  Result<std::shared_ptr<CapturedGraph>> made = be.end_capture();
  LATENT_TRY(st);
  if (!made.ok()) return made.status();
  g.graph = std::move(made).value();
  return ok_status();
}

Result<Tensor> QwenImageMmdit::run_graphed(const ForwardKey& key, const ForwardBody& body,
                                           const Tensor& hs, const Tensor& ehs, const Tensor& proj,
                                           const Tensor& mods) {
  Backend& be = *backend_;
  if (!graphs_enabled_ || !be.supports_capture()) return body(hs, ehs, proj, mods);
  ForwardGraph* g = nullptr;
  for (auto& e : graphs_)
    if (e->key.matches(key)) g = e.get();
  if (!g) {
    if (graphs_.size() >= kCachedInputs) graphs_.erase(graphs_.begin());
    graphs_.push_back(std::make_unique<ForwardGraph>());
    g = graphs_.back().get();
    g->key = key;
  }
  if (g->failed) return body(hs, ehs, proj, mods);
  if (!g->graph) {
    // The first forward of a shape runs plainly (every GEMM and attention plan is chosen, the
    // caches filled); the second too, and is then recorded (recording runs nothing); the third
    // on replay the graph.
    Result<Tensor> y = body(hs, ehs, proj, mods);
    if (!y.ok() || g->plain_runs++ == 0) return y;
    const Status st = capture_forward(*g, body, hs, ehs, proj, mods, *y);
    if (!st.ok()) {
      LATENT_WARN("QwenImageTransformer2DModel on ", be.name(), ": input ", shape_str(key.hs),
                  " runs without a graph: ", st.message());
      g->failed = true;
      g->in_hs = g->in_ehs = g->in_proj = g->in_mods = g->out = Tensor();
      g->graph.reset();
    } else {
      LATENT_DEBUG("QwenImageTransformer2DModel on ", be.name(), ": forward graph for input ",
                   shape_str(key.hs), ", text ", shape_str(key.ehs));
    }
    return y;
  }
  LATENT_TRY(be.copy_into(hs, g->in_hs));
  LATENT_TRY(be.copy_into(ehs, g->in_ehs));
  LATENT_TRY(be.copy_into(proj, g->in_proj));
  if (mods.defined()) LATENT_TRY(be.copy_into(mods, g->in_mods));
  LATENT_TRY(be.replay(*g->graph));
  ++graph_replays_;
  // A tensor of the caller's own: the next replay rewrites g->out (a CFG loop runs the
  // conditional and unconditional passes through one graph).
  return be.concat({g->out}, 0);
}

std::string QwenImageMmdit::description() const {
  std::string dtypes;
  for (const auto& [dt, n] : storage_dtypes_)
    dtypes += str_cat(dtypes.empty() ? "" : ", ", dt, " x", n);
  const auto& c = config_;
  std::string loras;
  for (const auto& l : loras_)
    loras += str_cat("lora: ", l.path, " strength ", l.strength, " (", lora_mode_name(lora_mode_),
                     ")\n");
  if (lora_mode_ == LoraMode::kRuntime && !runtime_loras_.empty())
    loras += str_cat("runtime LoRAs: on ", runtime_loras_.size(), " linear layers, ",
                     folded_lora_layers_, " of them folded into the layer's GEMM\n");
  return str_cat(
      "architecture: QwenImageTransformer2DModel\n", "weights: ", source_.weights_path, " (",
      dtypes, ")\n",
      source_.config_path.empty() ? "config: from the weights' shapes (no config.json)\n" : "",
      "parameters: ", parameters_, "\n", "num_layers: ", c.num_layers, "\n",
      "heads: ", c.num_attention_heads, " x ", c.attention_head_dim, " (inner dim ", c.inner_dim(),
      ")\n", "joint_attention_dim: ", c.joint_attention_dim, "\n",
      "in/out channels: ", c.in_channels, " / ", c.out_channels, ", patch ", c.patch_size, "\n",
      "axes_dims_rope: [", join(c.axes_dims_rope), "]\n",
      "zero_cond_t: ", c.zero_cond_t ? "true (references modulated at t = 0)" : "false", "\n",
      linear_format_ == LinearFormat::kFp8
          ? str_cat("linear layers: ", fp8_layers_,
                    " in fp8 e4m3 (a scale per output channel, inputs per token",
                    backend_->supports_fp8_linear() ? "" : "; emulated on this backend",
                    "), the rest in ", dtype_name(backend_->compute_dtype()), "\n",
                    "attention: its output quantised for to_out / to_add_out",
                    backend_->supports_fp8_linear()
                        ? str_cat("; q, k, v, probabilities and output in fp8 e4m3 (cuDNN's FP8 "
                                  "attention; one batch row, no runtime LoRA on the output "
                                  "layers, a key mask only as key lengths; q and k coded ",
                                  fp8_qk_codes_ ? "with static per-block bounds" : "by their amax",
                                  "; LATENT_FP8_ATTENTION=0: in the compute dtype)")
                        : " (computed in the compute dtype on this backend)",
                    "\n")
          : "",
      loras);
}

// ---------------------------------------------------------------------------------------------
// Forward

Result<Tensor> QwenImageMmdit::rope_table(const std::vector<ImageShape>& images, int64_t text_len) {
  for (const CachedRope& r : ropes_)
    if (r.images == images && r.text_len == text_len) return r.table;
  LATENT_ASSIGN_OR_RETURN(Tensor host,
                          qwen_image_rope_table(config_.axes_dims_rope, images, text_len));
  // [text, image] rows -> [image, text]
  Tensor reordered = Tensor::empty(host.shape(), DType::kF32);
  const size_t row = static_cast<size_t>(host.dim(1) * host.dim(2)) * sizeof(float);
  const size_t text_bytes = static_cast<size_t>(text_len) * row;
  const size_t image_bytes = static_cast<size_t>(host.dim(0) - text_len) * row;
  const char* from = static_cast<const char*>(host.data());
  char* to = static_cast<char*>(reordered.data());
  std::memcpy(to, from + text_bytes, image_bytes);
  std::memcpy(to + image_bytes, from, text_bytes);
  LATENT_ASSIGN_OR_RETURN(Tensor table, backend_->upload_fp32(reordered));
  if (ropes_.size() >= kCachedInputs) ropes_.erase(ropes_.begin());  // the oldest
  ropes_.push_back({images, text_len, table});
  return table;
}

namespace {

// What a block needs besides the weights, shared by every block of one forward.
struct BlockContext {
  Tensor silu_temb_img;  // [G*B, D]: silu(temb), G groups of conditioning for image tokens
  Tensor silu_temb_txt;  // [B, D]: silu(temb) at t for text tokens
  std::vector<int64_t> img_groups;   // token group starts of the image stream
  Tensor rope;                       // [T_img + T_txt, head_dim/2, 2] fp32
  Tensor key_mask;                   // [B, T_img + T_txt] or undefined
  std::vector<int64_t> key_lengths;  // with key_mask when the text padding is a tail, else empty
  int heads = 0;
  int64_t dim = 0;
  bool fp8_qk_codes =
      false;  // LATENT_FP8_ATTENTION=codes, the default (QwenImageMmdit::fp8_qk_codes_)
};

// Rows [start, start + count) of a quantised [1, T, K] matrix (the FP8 attention's output: image
// rows, then text rows), as views of its storage: codes, scales, or the emulation's dequant.
Result<Fp8Matrix> fp8_token_rows(const Fp8Matrix& m, int64_t start, int64_t count) {
  if (m.shape.size() != 3 || m.shape[0] != 1 || start < 0 || count < 1 ||
      start + count > m.shape[1])
    return Status::errorf("internal: rows [", start, ", ", start + count, ") of a quantised ",
                          shape_str(m.shape), " matrix (one batch row only)");
  const int64_t k = m.shape[2];
  Fp8Matrix r;
  r.shape = {1, count, k};
  auto rows_of = [&](const Tensor& t, int64_t row_bytes, const Shape& shape) {
    return Tensor::from_storage(
        t.storage(), t.byte_offset() + static_cast<size_t>(start * row_bytes), shape, t.dtype());
  };
  if (m.codes.defined()) r.codes = rows_of(m.codes, k, {count, k / 2});
  if (m.scales.defined()) r.scales = rows_of(m.scales, 4, {count});
  if (m.dequant.defined())
    r.dequant =
        rows_of(m.dequant, k * static_cast<int64_t>(dtype_size(m.dequant.dtype())), {1, count, k});
  return r;
}

// The k-th D-wide chunk of a modulation output [rows, 6D] -> [rows, D].
Result<Tensor> chunk(Backend& be, const Tensor& mod, int k, int64_t d) {
  return be.slice(mod, 1, k * d, d);
}

// The AdaLN-modulated LayerNorm of x for the linear layers `users`, in the form they read: the
// compute dtype (*xn; with `fold`, the users' FoldedLoras, the wide input [x | h]) and, when
// they are FP8, its quantised rows (*xq). When every user is FP8
// and none adds a runtime LoRA (which reads the compute-dtype input), the norm writes the
// quantised rows directly and *xn stays undefined.
Status normalized_input(Backend& be, const Tensor& x, const Tensor& shift, const Tensor& scale,
                        const std::vector<int64_t>& groups,
                        std::initializer_list<const Linear*> users, const FoldedLoras* fold,
                        Tensor* xn, Fp8Matrix* xq) {
  if (fold) {  // the users' LoRAs folded into their GEMMs: the wide input [x | h]
    *xq = Fp8Matrix();
    LATENT_ASSIGN_OR_RETURN(
        *xn, be.layer_norm_modulate_wide(x, shift, scale, groups, kNormEps, fold->extra));
    LATENT_ASSIGN_OR_RETURN(*xn, fold->fill(be, *xn));
    return ok_status();
  }
  bool fp8 = true, adapted = false;
  for (const Linear* l : users) {
    fp8 = fp8 && l->w8.defined();
    adapted = adapted || (l->lora && l->lora->up.defined());
  }
  *xn = Tensor();
  *xq = Fp8Matrix();
  if (fp8 && !adapted) {
    LATENT_ASSIGN_OR_RETURN(*xq, be.layer_norm_modulate_fp8(x, shift, scale, groups, kNormEps));
    return ok_status();
  }
  LATENT_ASSIGN_OR_RETURN(*xn, be.layer_norm_modulate(x, shift, scale, groups, kNormEps));
  if (fp8) {
    LATENT_ASSIGN_OR_RETURN(*xq, be.fp8_quantize_rows(*xn));
  }
  return ok_status();
}

// A block's modulation rows: [G*B, 6D] for the image tokens, [B, 6D] for the text.
Status block_modulation(Backend& be, const Block& w, const Tensor& silu_temb_img,
                        const Tensor& silu_temb_txt, Tensor* img_mod, Tensor* txt_mod) {
  LATENT_ASSIGN_OR_RETURN(*img_mod, w.img_mod(be, silu_temb_img));
  LATENT_ASSIGN_OR_RETURN(*txt_mod, w.txt_mod(be, silu_temb_txt));
  return ok_status();
}

// One QwenImageTransformerBlock. img: [B, T_img, D], txt: [B, T_txt, D]; updated in place of
// the handles. `mods`: this block's modulation rows ([G*B + B, 6D], block_modulation's two
// stacked) when cached, else undefined (computed here).
Status block_forward(Backend& be, const Block& w, const BlockContext& c, const Tensor& mods,
                     Tensor* img, Tensor* txt) {
  const int64_t d = c.dim;
  const int64_t t_txt = txt->dim(1), t_img = img->dim(1);
  const std::vector<int64_t> one_group = {0};
  // residual + gate * layer(x) (xq: x quantised, or null): inside the layer's GEMM for a plain
  // FP8 layer with one batch row and one token group whose input is not wide (`wide_x`: x
  // carries the layer's folded LoRA columns), else the layer and then Backend::gated_add.
  const auto gated_out = [&](const Linear& l, const Tensor& x, const Fp8Matrix* xq,
                             const Tensor& gate, const Tensor& residual,
                             const std::vector<int64_t>& groups, bool wide_x) -> Result<Tensor> {
    if (!wide_x && residual.dim(0) == 1 && groups.size() == 1 && l.plain_fp8())
      return l.gated_add(be, x, xq, gate, residual);
    LATENT_ASSIGN_OR_RETURN(Tensor o, l(be, x, DitActivation::kNone, xq));
    return be.gated_add(residual, o, gate, groups);
  };
  // Modulation: [rows, 6D] = shift1, scale1, gate1 (attention), shift2, scale2, gate2 (MLP).
  Tensor img_mod, txt_mod;  // [G*B, 6D], [B, 6D]
  if (mods.defined()) {
    const int64_t img_rows = c.silu_temb_img.dim(0), txt_rows = c.silu_temb_txt.dim(0);
    LATENT_ASSIGN_OR_RETURN(img_mod, be.slice(mods, 0, 0, img_rows));
    LATENT_ASSIGN_OR_RETURN(txt_mod, be.slice(mods, 0, img_rows, txt_rows));
  } else {
    LATENT_TRY(block_modulation(be, w, c.silu_temb_img, c.silu_temb_txt, &img_mod, &txt_mod));
  }
  Tensor im[6], tm[6];
  for (int k = 0; k < 6; ++k) {
    LATENT_ASSIGN_OR_RETURN(im[k], chunk(be, img_mod, k, d));
    LATENT_ASSIGN_OR_RETURN(tm[k], chunk(be, txt_mod, k, d));
  }

  // Attention. x: [B, T, D] per stream; joint sequence [image, text] (see the header).
  Tensor img_n, txt_n;
  Fp8Matrix img_q, txt_q;  // FP8 layers: each stream's input quantised once for q, k and v
  LATENT_TRY(normalized_input(be, *img, im[0], im[1], c.img_groups, {&w.to_q, &w.to_k, &w.to_v},
                              w.fold_qkv.get(), &img_n, &img_q));
  LATENT_TRY(normalized_input(be, *txt, tm[0], tm[1], one_group, {&w.add_q, &w.add_k, &w.add_v},
                              w.fold_add_qkv.get(), &txt_n, &txt_q));
  const DitActivation none = DitActivation::kNone;
  LATENT_ASSIGN_OR_RETURN(Tensor q_i, w.to_q(be, img_n, none, &img_q));  // [B, T_img, D]
  LATENT_ASSIGN_OR_RETURN(Tensor k_i, w.to_k(be, img_n, none, &img_q));
  LATENT_ASSIGN_OR_RETURN(Tensor q_t, w.add_q(be, txt_n, none, &txt_q));  // [B, T_txt, D]
  LATENT_ASSIGN_OR_RETURN(Tensor k_t, w.add_k(be, txt_n, none, &txt_q));
  // v joined [image, text] (as the attention reads it): FP8 layers of one batch row write their
  // rows into it in place.
  // LATENT_FP8_JOIN_V=0: the two outputs concatenated after (the A/B of bench_img2img.py).
  static const bool join_v = env_choice("LATENT_FP8_JOIN_V", {{"1"}, {"0"}}, 0) == 0;
  Tensor v;
  if (join_v && img->dim(0) == 1 && img_q.defined() && txt_q.defined() && w.to_v.plain_fp8() &&
      w.add_v.plain_fp8()) {
    LATENT_ASSIGN_OR_RETURN(
        v, be.linear_fp8_joined(img_q, w.to_v.w8, w.to_v.b, txt_q, w.add_v.w8, w.add_v.b));
  } else {
    LATENT_ASSIGN_OR_RETURN(Tensor v_i, w.to_v(be, img_n, none, &img_q));
    LATENT_ASSIGN_OR_RETURN(Tensor v_t, w.add_v(be, txt_n, none, &txt_q));
    LATENT_ASSIGN_OR_RETURN(v, be.concat({v_i, v_t}, 1));
  }
  img_q = Fp8Matrix();  // released before the attention
  txt_q = Fp8Matrix();
  // With the output layers' LoRAs folded, the attention writes its rows wide ([o | o downᵀ]),
  // as many columns more as the larger of the two streams' FoldedLoras needs.
  const FoldedLoras* out_fold = w.fold_out.get();
  const FoldedLoras* add_out_fold = w.fold_add_out.get();
  const int64_t o_extra =
      std::max(out_fold ? out_fold->extra : 0, add_out_fold ? add_out_fold->extra : 0);
  // FP8 output layers without runtime LoRAs (which read the compute-dtype input) take the
  // attention's output quantised as it is written (Backend::attention_fp8: on Hopper cuDNN's FP8
  // attention); one batch row (the image and text rows are then views of it).
  const bool fp8_out =
      o_extra == 0 && q_i.dim(0) == 1 && w.to_out.plain_fp8() && w.to_add_out.plain_fp8();
  // Per-head RMS QK norm, the streams joined [image, text], rope: [B, T_img + T_txt, D]; with
  // LATENT_FP8_ATTENTION=codes, q and k written as e4m3 codes with the block's static bounds.
  Tensor q, k;
  Fp8Matrix q8, k8;
  if (fp8_out && c.fp8_qk_codes && w.q_bound > 0.f && w.k_bound > 0.f) {
    LATENT_ASSIGN_OR_RETURN(q8, be.joint_qk_fp8(q_i, q_t, w.norm_q, w.norm_added_q, c.rope, c.heads,
                                                kNormEps, w.q_bound));
    LATENT_ASSIGN_OR_RETURN(k8, be.joint_qk_fp8(k_i, k_t, w.norm_k, w.norm_added_k, c.rope, c.heads,
                                                kNormEps, w.k_bound));
  } else {
    LATENT_ASSIGN_OR_RETURN(
        q, be.joint_qk(q_i, q_t, w.norm_q, w.norm_added_q, c.rope, c.heads, kNormEps));
    LATENT_ASSIGN_OR_RETURN(
        k, be.joint_qk(k_i, k_t, w.norm_k, w.norm_added_k, c.rope, c.heads, kNormEps));
  }
  if (fp8_out) {
    Fp8Matrix o8;
    if (q8.defined()) {
      LATENT_ASSIGN_OR_RETURN(
          o8, be.attention_fp8_coded(q8, k8, v, c.heads, c.key_mask, c.key_lengths));
    } else {
      LATENT_ASSIGN_OR_RETURN(o8, be.attention_fp8(q, k, v, c.heads, c.key_mask, c.key_lengths));
    }
    LATENT_ASSIGN_OR_RETURN(img_q, fp8_token_rows(o8, 0, t_img));
    LATENT_ASSIGN_OR_RETURN(txt_q, fp8_token_rows(o8, t_img, t_txt));
    LATENT_ASSIGN_OR_RETURN(
        *img, gated_out(w.to_out, Tensor(), &img_q, im[2], *img, c.img_groups, false));
    LATENT_ASSIGN_OR_RETURN(
        *txt, gated_out(w.to_add_out, Tensor(), &txt_q, tm[2], *txt, one_group, false));
    img_q = Fp8Matrix();
    txt_q = Fp8Matrix();
  } else {
    Tensor o;  // [B, T, D (+ o_extra)]
    if (o_extra > 0) {
      LATENT_ASSIGN_OR_RETURN(
          o, be.attention_wide(q, k, v, c.heads, c.key_mask, c.key_lengths, o_extra));
    } else {
      LATENT_ASSIGN_OR_RETURN(o, be.attention(q, k, v, c.heads, c.key_mask, c.key_lengths));
    }
    LATENT_ASSIGN_OR_RETURN(Tensor o_i, be.slice(o, 1, 0, t_img));      // [B, T_img, D (+)]
    LATENT_ASSIGN_OR_RETURN(Tensor o_t, be.slice(o, 1, t_img, t_txt));  // [B, T_txt, D (+)]
    if (out_fold) {
      LATENT_ASSIGN_OR_RETURN(o_i, out_fold->fill(be, o_i));
    }
    if (add_out_fold) {
      LATENT_ASSIGN_OR_RETURN(o_t, add_out_fold->fill(be, o_t));
    }
    LATENT_ASSIGN_OR_RETURN(o_i, w.to_out(be, o_i));
    LATENT_ASSIGN_OR_RETURN(o_t, w.to_add_out(be, o_t));
    LATENT_ASSIGN_OR_RETURN(*img, be.gated_add(*img, o_i, im[2], c.img_groups));
    LATENT_ASSIGN_OR_RETURN(*txt, be.gated_add(*txt, o_t, tm[2], one_group));
  }

  // MLPs. x: [B, T, D] -> [B, T, 4D] -> [B, T, D]
  // With the output layer's LoRAs folded, the hidden activation is written wide ([h | h down^T]).
  const FoldedLoras* img_out_fold = w.fold_img_mlp_out.get();
  const FoldedLoras* txt_out_fold = w.fold_txt_mlp_out.get();
  LATENT_TRY(normalized_input(be, *img, im[3], im[4], c.img_groups, {&w.img_mlp_in},
                              w.fold_img_mlp_in.get(), &img_n, &img_q));
  LATENT_ASSIGN_OR_RETURN(Tensor h_i, w.img_mlp_in(be, img_n, DitActivation::kGELUTanh, &img_q,
                                                   img_out_fold ? img_out_fold->extra : 0));
  img_q = Fp8Matrix();
  if (img_out_fold) {
    LATENT_ASSIGN_OR_RETURN(h_i, img_out_fold->fill(be, h_i));
  }
  LATENT_ASSIGN_OR_RETURN(*img, gated_out(w.img_mlp_out, h_i, nullptr, im[5], *img, c.img_groups,
                                          img_out_fold != nullptr));
  LATENT_TRY(normalized_input(be, *txt, tm[3], tm[4], one_group, {&w.txt_mlp_in},
                              w.fold_txt_mlp_in.get(), &txt_n, &txt_q));
  LATENT_ASSIGN_OR_RETURN(Tensor h_t, w.txt_mlp_in(be, txt_n, DitActivation::kGELUTanh, &txt_q,
                                                   txt_out_fold ? txt_out_fold->extra : 0));
  txt_q = Fp8Matrix();
  if (txt_out_fold) {
    LATENT_ASSIGN_OR_RETURN(h_t, txt_out_fold->fill(be, h_t));
  }
  LATENT_ASSIGN_OR_RETURN(*txt, gated_out(w.txt_mlp_out, h_t, nullptr, tm[5], *txt, one_group,
                                          txt_out_fold != nullptr));
  return ok_status();
}

}  // namespace

namespace {

// silu(temb) of the timestep projections `proj` ([G*B, 256]) for the image rows ([G*B, D]) and
// the text rows ([B, D]: the first group's).
Status silu_temb(Backend& be, const QwenImageMmdit::Weights& w, const Tensor& proj, bool two_groups,
                 int64_t batch, Tensor* img, Tensor* txt) {
  LATENT_ASSIGN_OR_RETURN(Tensor temb, w.time_1(be, proj, DitActivation::kSiLU));
  LATENT_ASSIGN_OR_RETURN(temb, w.time_2(be, temb));
  LATENT_ASSIGN_OR_RETURN(*img, be.dit_activation(temb, DitActivation::kSiLU));
  if (two_groups) {
    LATENT_ASSIGN_OR_RETURN(*txt, be.slice(*img, 0, 0, batch));  // [B, D]
  } else {
    *txt = *img;
  }
  return ok_status();
}

// Every block's modulation rows stacked: [blocks * (G*B + B), 6D] (QwenImageMmdit::modulations).
Result<Tensor> all_modulations(Backend& be, const QwenImageMmdit::Weights& w, const Tensor& proj,
                               bool two_groups, int64_t batch) {
  Tensor img, txt;
  LATENT_TRY(silu_temb(be, w, proj, two_groups, batch, &img, &txt));
  std::vector<Tensor> rows;
  for (size_t i = 0; i < w.blocks.size(); ++i) {
    Tensor img_mod, txt_mod;
    LATENT_TRY(block_modulation(be, w.blocks[i], img, txt, &img_mod, &txt_mod)
                   .with_context(str_cat("QwenImageTransformer2DModel block ", i, " modulation")));
    rows.push_back(std::move(img_mod));
    rows.push_back(std::move(txt_mod));
  }
  return be.concat(rows, 0);
}

// The transformer's device work for prepared inputs (QwenImageMmdit::forward): timestep
// embedding, input projections, the blocks, the output layers. Nothing here reads or writes
// host memory or waits for the device, so a graph can record it. `mods`: all_modulations() of
// `proj` when cached, else undefined (each block computes its own).
Result<Tensor> forward_body(Backend& be, const QwenImageMmdit::Weights& w, BlockContext ctx,
                            const Tensor& hs, const Tensor& ehs, const Tensor& proj,
                            const Tensor& mods, int64_t t_run, bool two_groups, int64_t batch) {
  const char* op = "QwenImageTransformer2DModel";
  const int64_t t_txt = ehs.dim(1);
  // Timestep embedding: [G*B, 256] -> [G*B, D]; every modulation reads silu(temb).
  LATENT_TRY(silu_temb(be, w, proj, two_groups, batch, &ctx.silu_temb_img, &ctx.silu_temb_txt));

  // Input projections. img: [B, T_img, D]; txt: [B, T_txt, D]
  LATENT_ASSIGN_OR_RETURN(Tensor img, w.img_in(be, hs));
  Tensor ehs_run = ehs;  // [B, T_run, joint_attention_dim]
  if (t_run < t_txt) {
    LATENT_ASSIGN_OR_RETURN(ehs_run, be.slice(ehs, 1, 0, t_run));
  }
  LATENT_ASSIGN_OR_RETURN(Tensor txt, be.rms_norm(ehs_run, w.txt_norm, kNormEps));
  LATENT_ASSIGN_OR_RETURN(txt, w.txt_in(be, txt));

  const int64_t mod_rows = ctx.silu_temb_img.dim(0) + ctx.silu_temb_txt.dim(0);
  if (mods.defined() && mods.dim(0) != mod_rows * static_cast<int64_t>(w.blocks.size()))
    return Status::errorf(op, ": cached modulations ", shape_str(mods.shape()), " are not ",
                          w.blocks.size(), " blocks of ", mod_rows, " rows");
  for (size_t i = 0; i < w.blocks.size(); ++i) {
    Tensor block_mods;
    if (mods.defined()) {
      LATENT_ASSIGN_OR_RETURN(block_mods,
                              be.slice(mods, 0, static_cast<int64_t>(i) * mod_rows, mod_rows));
    }
    LATENT_TRY(block_forward(be, w.blocks[i], ctx, block_mods, &img, &txt)
                   .with_context(str_cat(op, " block ", i)));
  }

  // Output: AdaLayerNormContinuous (linear(silu(temb)) -> scale, shift) and proj_out.
  LATENT_ASSIGN_OR_RETURN(Tensor emb, w.norm_out(be, ctx.silu_temb_txt));  // [B, 2D]
  LATENT_ASSIGN_OR_RETURN(Tensor scale, be.slice(emb, 1, 0, ctx.dim));
  LATENT_ASSIGN_OR_RETURN(Tensor shift, be.slice(emb, 1, ctx.dim, ctx.dim));
  LATENT_ASSIGN_OR_RETURN(img, be.layer_norm_modulate(img, shift, scale, {0}, kNormEps));
  return w.proj_out(be, img);  // [B, T_img, p*p*out]
}

}  // namespace

Result<Tensor> QwenImageMmdit::forward(const MmditInputs& in) {
  Backend& be = *backend_;
  const auto& c = config_;
  const char* op = "QwenImageTransformer2DModel";
  // hidden_states: [B, T_img, in_channels]; encoder_hidden_states: [B, T_txt, joint_attention_dim]
  const Tensor& hs = in.hidden_states;
  const Tensor& ehs = in.encoder_hidden_states;
  if (!hs.defined() || hs.rank() != 3 || hs.dim(2) != c.in_channels)
    return Status::errorf(op, ": hidden_states must be [B, T_img, ", c.in_channels, "], got ",
                          hs.defined() ? shape_str(hs.shape()) : "nothing");
  const int64_t batch = hs.dim(0), t_img = hs.dim(1);
  if (!ehs.defined() || ehs.rank() != 3 || ehs.dim(0) != batch ||
      ehs.dim(2) != c.joint_attention_dim)
    return Status::errorf(op, ": encoder_hidden_states must be [", batch, ", T_txt, ",
                          c.joint_attention_dim, "], got ",
                          ehs.defined() ? shape_str(ehs.shape()) : "nothing");
  const int64_t t_txt = ehs.dim(1);
  if (static_cast<int64_t>(in.timestep.size()) != batch)
    return Status::errorf(op, ": ", in.timestep.size(), " timestep values for a batch of ", batch);
  for (float t : in.timestep)
    if (!std::isfinite(t)) return Status::errorf(op, ": timestep ", t, " is not finite");
  if (in.img_shapes.empty()) return Status::errorf(op, ": img_shapes is empty");
  int64_t tokens = 0;
  for (const ImageShape& s : in.img_shapes) tokens += s.tokens();
  if (tokens != t_img)
    return Status::errorf(op, ": img_shapes describe ", tokens, " tokens but hidden_states ",
                          shape_str(hs.shape()), " holds ", t_img);
  const bool has_mask = !in.encoder_hidden_states_mask.empty();
  if (has_mask && static_cast<int64_t>(in.encoder_hidden_states_mask.size()) != batch * t_txt)
    return Status::errorf(op, ": encoder_hidden_states_mask has ",
                          in.encoder_hidden_states_mask.size(), " values for [", batch, ", ", t_txt,
                          "] text tokens");

  // zero_cond_t with reference images: conditioning group 0 (target) at t, group 1 at t = 0.
  const bool two_groups = c.zero_cond_t && in.img_shapes.size() > 1;
  BlockContext ctx;
  ctx.heads = static_cast<int>(c.num_attention_heads);
  ctx.dim = c.inner_dim();
  ctx.fp8_qk_codes = fp8_qk_codes_;
  ctx.img_groups = {0};
  std::vector<float> ts = in.timestep;
  if (two_groups) {
    ctx.img_groups.push_back(in.img_shapes[0].tokens());
    ts.insert(ts.end(), static_cast<size_t>(batch), 0.f);
  }

  // Timestep embedding input: [G*B, 256] (the projections), on the backend.
  Tensor proj;
  if (in.timestep_proj.defined()) {
    const Shape want = {static_cast<int64_t>(ts.size()), kTimeProjDim};
    if (in.timestep_proj.shape() != want)
      return Status::errorf(op, ": timestep_proj ", shape_str(in.timestep_proj.shape()),
                            " should be ", shape_str(want), " for ", ts.size(), " timesteps");
    proj = in.timestep_proj;
  } else {
    LATENT_ASSIGN_OR_RETURN(proj, be.upload(qwen_image_timestep_proj(ts)));
  }
  // Every block's modulation for these timesteps, cached (undefined: the blocks compute it).
  LATENT_ASSIGN_OR_RETURN(const Tensor mods, modulations(ts, batch, proj));

  // The text as the blocks run it: right padding cut (see the header), or all of it.
  TextPadding pad;
  if (in.trim_text_padding) {
    pad = qwen_image_text_padding(in.encoder_hidden_states_mask, batch, t_txt);
  } else {
    pad.kept = t_txt;
  }
  const int64_t t_run = pad.kept;
  LATENT_ASSIGN_OR_RETURN(ctx.rope, rope_table(in.img_shapes, t_run));
  if (has_mask) {
    const auto& m = in.encoder_hidden_states_mask;
    bool all_valid = true;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < t_run; ++j) all_valid = all_valid && m[b * t_txt + j] != 0.f;
    if (!all_valid) {
      // Joint key mask [B, T_img + T_run]: every image token, then the kept text's mask.
      const int64_t s_len = t_img + t_run;
      Tensor host = Tensor::empty({batch, s_len}, DType::kF32);
      float* p = host.data_as<float>();
      for (int64_t b = 0; b < batch; ++b) {
        std::fill(p + b * s_len, p + b * s_len + t_img, 1.f);
        for (int64_t j = 0; j < t_run; ++j) p[b * s_len + t_img + j] = m[b * t_txt + j] != 0.f;
      }
      if (pad.prefix)
        for (int64_t len : pad.lengths) ctx.key_lengths.push_back(t_img + len);
      std::vector<float> values(p, p + host.numel());
      for (const CachedMask& c : key_masks_)
        if (c.shape == host.shape() && c.values == values) ctx.key_mask = c.mask;
      if (!ctx.key_mask.defined()) {
        LATENT_ASSIGN_OR_RETURN(ctx.key_mask, be.upload(host));
        if (key_masks_.size() >= kCachedInputs) key_masks_.erase(key_masks_.begin());
        key_masks_.push_back({host.shape(), std::move(values), ctx.key_mask});
      }
    }
  }

  // The device work: everything above is host-side preparation (and cached uploads), so what
  // follows can be captured as a graph and replayed with new inputs (run_graphed).
  auto body = [&](const Tensor& hs_in, const Tensor& ehs_in, const Tensor& proj_in,
                  const Tensor& mods_in) -> Result<Tensor> {
    return forward_body(be, *w_, ctx, hs_in, ehs_in, proj_in, mods_in, t_run, two_groups, batch);
  };
  ForwardKey key{
      hs.shape(),  ehs.shape(),    proj.shape(),    mods.defined() ? mods.shape() : Shape(),
      t_run,       ctx.img_groups, ctx.key_lengths, ctx.rope,
      ctx.key_mask};
  return run_graphed(key, body, hs, ehs, proj, mods);
}

void QwenImageMmdit::set_modulation_cache(bool on) {
  mod_cache_enabled_ = on;
  if (!on) mods_.clear();
}

Result<Tensor> QwenImageMmdit::modulations(const std::vector<float>& timesteps, int64_t batch,
                                           const Tensor& proj) {
  if (!mod_cache_enabled_) return Tensor();
  for (const CachedModulation& m : mods_)
    if (m.batch == batch && m.timesteps == timesteps) {
      ++mod_cache_hits_;
      return m.mods;
    }
  const bool two_groups = static_cast<int64_t>(timesteps.size()) == 2 * batch;
  LATENT_ASSIGN_OR_RETURN(Tensor mods, all_modulations(*backend_, *w_, proj, two_groups, batch));
  if (mods_.size() >= kCachedModulations) mods_.erase(mods_.begin());  // the oldest
  mods_.push_back({timesteps, batch, mods});
  return mods;
}

Result<Tensor> QwenImageMmdit::timestep_projections(const std::vector<float>& timesteps) {
  if (timesteps.empty()) return Status::error("timestep_projections: no timesteps");
  if (!proj_.defined() || proj_timesteps_ != timesteps) {
    proj_ = Tensor();
    LATENT_ASSIGN_OR_RETURN(proj_, backend_->upload(qwen_image_timestep_proj(timesteps)));
    proj_timesteps_ = timesteps;
  }
  return proj_;
}

}  // namespace latent
