// The Qwen-Image denoising loop; see denoise.h.
#include "engine/models/dit/denoise.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/core/log.h"

namespace latent {

namespace {

// Latent dims of a host latent given as [B, C, 1, h, w], [B, 1, C, h, w] (the pipelines' noise
// layout, the same memory for one frame) or [B, C, h, w]: -> {B, C, h, w}.
Result<std::vector<int64_t>> latent_dims(const Tensor& t, const char* what) {
  if (!t.defined()) return Status::errorf(what, " is undefined");
  const Shape& s = t.shape();
  if (s.size() == 4) return std::vector<int64_t>{s[0], s[1], s[2], s[3]};
  if (s.size() == 5 && s[2] == 1) return std::vector<int64_t>{s[0], s[1], s[3], s[4]};
  if (s.size() == 5 && s[1] == 1) return std::vector<int64_t>{s[0], s[2], s[3], s[4]};
  return Status::errorf(what, " must be [B, C, 1, h, w] (one frame) or [B, C, h, w], got ",
                        shape_str(s));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Packing

Result<Tensor> pack_latents(const Tensor& latents) {
  // [B, C, 1, h, w] -> [B, (h/2)(w/2), 4C]: view(B, C, h/2, 2, w/2, 2).permute(0, 2, 4, 1, 3, 5)
  LATENT_ASSIGN_OR_RETURN(std::vector<int64_t> d, latent_dims(latents, "pack_latents: latents"));
  const int64_t b = d[0], c = d[1], h = d[2], w = d[3];
  if (h % 2 || w % 2 || h < 2 || w < 2)
    return Status::errorf("pack_latents: latent height and width must be even, got ", h, " x ", w);
  const std::vector<float> src = latents.to_floats();
  Tensor out = Tensor::empty({b, (h / 2) * (w / 2), 4 * c}, DType::kF32);
  float* dst = out.data_as<float>();
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t y = 0; y < h / 2; ++y)
      for (int64_t x = 0; x < w / 2; ++x)
        for (int64_t ci = 0; ci < c; ++ci)
          for (int64_t dy = 0; dy < 2; ++dy)
            for (int64_t dx = 0; dx < 2; ++dx)
              *dst++ = src[((bi * c + ci) * h + 2 * y + dy) * w + 2 * x + dx];
  return out;
}

Result<Tensor> unpack_latents(const Tensor& packed, int64_t height, int64_t width) {
  // [B, (h/2)(w/2), 4C] -> [B, C, 1, h, w]: view(B, h/2, w/2, C, 2, 2).permute(0, 3, 1, 4, 2, 5)
  if (!packed.defined() || packed.rank() != 3 || packed.dim(2) % 4 != 0)
    return Status::errorf("unpack_latents: expected [B, tokens, 4C], got ",
                          packed.defined() ? shape_str(packed.shape()) : "nothing");
  if (height % 2 || width % 2 || height < 2 || width < 2 ||
      packed.dim(1) != (height / 2) * (width / 2))
    return Status::errorf("unpack_latents: ", packed.dim(1), " tokens do not make a ", height,
                          " x ", width, " latent (even sides, (h/2)(w/2) tokens)");
  const int64_t b = packed.dim(0), c = packed.dim(2) / 4, h = height, w = width;
  const std::vector<float> src = packed.to_floats();
  Tensor out = Tensor::empty({b, c, 1, h, w}, DType::kF32);
  float* dst = out.data_as<float>();
  const float* p = src.data();
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t y = 0; y < h / 2; ++y)
      for (int64_t x = 0; x < w / 2; ++x)
        for (int64_t ci = 0; ci < c; ++ci)
          for (int64_t dy = 0; dy < 2; ++dy)
            for (int64_t dx = 0; dx < 2; ++dx)
              dst[((bi * c + ci) * h + 2 * y + dy) * w + 2 * x + dx] = *p++;
  return out;
}

// ---------------------------------------------------------------------------------------------
// torch.randn

Result<Tensor> torch_randn(const Shape& shape, uint64_t seed) {
  const int64_t n = shape_numel(shape);
  if (n < 16)
    return Status::errorf("torch_randn: ", shape_str(shape),
                          " has fewer than 16 elements, where "
                          "torch switches to another sampling algorithm");
  // CPUGeneratorImpl: at::mt19937 seeded with the seed's low 32 bits (init_with_uint32).
  std::mt19937 engine(static_cast<uint32_t>(seed & 0xffffffffu));
  // uniform_real_distribution<float>(0, 1): the low 24 bits of one 32-bit draw, / 2^24.
  auto uniform = [&engine]() {
    return static_cast<float>((engine() & ((1u << 24) - 1)) * (1.0 / (1u << 24)));
  };
  // normal_fill_16: Box-Muller on 16 uniforms, the first 8 as u1, the next 8 as u2.
  auto fill16 = [](float* d) {
    const float two_pi = static_cast<float>(2.0 * M_PI);
    for (int j = 0; j < 8; ++j) {
      const float u1 = 1.f - d[j], u2 = d[j + 8];
      const float radius = std::sqrt(-2.f * std::log(u1));
      const float theta = two_pi * u2;
      d[j] = radius * std::cos(theta);
      d[j + 8] = radius * std::sin(theta);
    }
  };
  Tensor t = Tensor::empty(shape, DType::kF32);
  float* data = t.data_as<float>();
  for (int64_t i = 0; i < n; ++i) data[i] = uniform();
  for (int64_t i = 0; i + 16 <= n; i += 16) fill16(data + i);
  if (n % 16 != 0) {  // torch redraws the last 16 values
    float* tail = data + n - 16;
    for (int i = 0; i < 16; ++i) tail[i] = uniform();
    fill16(tail);
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// The loop

namespace {

// Host [1, T, D] embeds padded with zero tokens to `len` tokens: its values, [len, D].
std::vector<float> pad_tokens(const Tensor& embeds, int64_t len) {
  std::vector<float> v = embeds.to_floats();
  v.resize(static_cast<size_t>(len * embeds.dim(2)), 0.f);
  return v;
}

// The mask of `p` padded with zeros (padding tokens) to `len`; all ones where none was given.
std::vector<float> mask_or_ones(const PromptEmbeds& p, int64_t len) {
  std::vector<float> m =
      p.mask.empty() ? std::vector<float>(static_cast<size_t>(p.embeds.dim(1)), 1.f) : p.mask;
  m.resize(static_cast<size_t>(len), 0.f);
  return m;
}

// The latent channels of the transformer's input: it must pack 2x2 patches of them.
Result<int64_t> packed_latent_channels(const QwenImageMmditConfig& cfg) {
  if (cfg.patch_size != 2 || cfg.in_channels % 4 != 0)
    return Status::errorf(
        "denoise: the pipelines pack 2x2 patches; this transformer has patch_size ", cfg.patch_size,
        " and ", cfg.in_channels, " input channels");
  return cfg.in_channels / 4;
}

// Dims {1, C, h, w} of a latent that must hold one image of `channels`; `what` (and `which`,
// appended in the messages about its shape) names it.
Result<std::vector<int64_t>> one_latent_dims(const Tensor& t, int64_t channels, const char* what,
                                             const std::string& which = "") {
  LATENT_ASSIGN_OR_RETURN(std::vector<int64_t> d, latent_dims(t, what));
  if (d[0] != 1 || d[1] != channels)
    return Status::errorf(what, which, " ", shape_str(t.shape()), " must hold one latent of ",
                          channels, " channels");
  return d;
}

// The target latent h x w and, for img2img (strength < 1), its init latents.
Status check_target(int64_t h, int64_t w, double strength, bool has_init) {
  if (h < 2 || w < 2 || h % 2 || w % 2)
    return Status::errorf("denoise: the target latent must have even sides of at least 2, got ", h,
                          " x ", w);
  if (strength < 1.0 && !has_init)
    return Status::errorf("denoise: strength ", strength, " needs init latents (img2img)");
  return ok_status();
}

Status check_prompt(const PromptEmbeds& p, const char* what, int64_t dim) {
  if (!p.embeds.defined()) return Status::errorf("denoise: no ", what);
  if (p.embeds.rank() != 3 || p.embeds.dim(0) != 1 || p.embeds.dim(1) < 1 || p.embeds.dim(2) != dim)
    return Status::errorf("denoise: ", what, " must be [1, T, ", dim, "], got ",
                          shape_str(p.embeds.shape()));
  if (!p.mask.empty() && static_cast<int64_t>(p.mask.size()) != p.embeds.dim(1))
    return Status::errorf("denoise: the mask of ", what, " has ", p.mask.size(), " values for ",
                          p.embeds.dim(1), " tokens");
  return ok_status();
}

}  // namespace

Result<DenoisePrompts> upload_denoise_prompts(QwenImageMmdit& model, const PromptEmbeds& prompt,
                                              const PromptEmbeds& negative, bool batch_cfg) {
  Backend& be = model.backend();
  const int64_t dim = model.config().joint_attention_dim;
  LATENT_TRY(check_prompt(prompt, "prompt embeds", dim));
  DenoisePrompts out;
  out.has_negative = negative.defined();
  if (out.has_negative) LATENT_TRY(check_prompt(negative, "negative prompt embeds", dim));
  out.batched = out.has_negative && batch_cfg;
  if (out.batched) {
    // [2, len, D]: prompt, then negative, each padded with masked zero tokens to `len`
    const int64_t len = std::max(prompt.embeds.dim(1), negative.embeds.dim(1));
    std::vector<float> both = pad_tokens(prompt.embeds, len);
    const std::vector<float> neg = pad_tokens(negative.embeds, len);
    both.insert(both.end(), neg.begin(), neg.end());
    LATENT_ASSIGN_OR_RETURN(out.cond, be.upload(Tensor::from_floats({2, len, dim}, both)));
    out.cond_mask = mask_or_ones(prompt, len);
    const std::vector<float> nm = mask_or_ones(negative, len);
    out.cond_mask.insert(out.cond_mask.end(), nm.begin(), nm.end());
  } else {
    LATENT_ASSIGN_OR_RETURN(out.cond, be.upload(prompt.embeds));
    out.cond_mask = prompt.mask;
    if (out.has_negative) {
      LATENT_ASSIGN_OR_RETURN(out.uncond, be.upload(negative.embeds));
      out.uncond_mask = negative.mask;
    }
  }
  return out;
}

Result<Tensor> upload_latent(Backend& backend, const Tensor& host) {
  LATENT_ASSIGN_OR_RETURN(std::vector<int64_t> d, latent_dims(host, "latents"));
  if (!host.device().is_cpu())
    return Status::errorf("latents ", host.describe(), " are not on the host");
  // [1, C, 1, h, w] and [1, 1, C, h, w] hold one frame as [1, C, h, w] does
  LATENT_ASSIGN_OR_RETURN(Tensor flat, host.reshape({d[0], d[1], d[2], d[3]}));
  return backend.upload(flat);
}

Result<DeviceDenoiseResult> qwen_image_denoise_on_backend(QwenImageMmdit& model,
                                                          const FlowMatchSchedulerConfig& scheduler,
                                                          const DeviceDenoiseRequest& req,
                                                          const DenoiseProgress& progress) {
  Backend& be = model.backend();
  const QwenImageMmditConfig& cfg = model.config();
  LATENT_ASSIGN_OR_RETURN(const int64_t channels, packed_latent_channels(cfg));
  if (cfg.out_channels != channels)
    return Status::errorf("denoise: transformer out_channels ", cfg.out_channels,
                          " differs from its ", channels, " latent input channels");
  if (!req.prompts || !req.prompts->defined())
    return Status::error("denoise: no prompt embeddings (upload_denoise_prompts())");
  if (!req.noise.defined()) return Status::error("denoise: no initial noise");

  // Target size from the noise; init latents must match it.
  int64_t h = 0, w = 0;
  for (const Tensor* t : {&req.noise, &req.init_latents}) {
    if (!t->defined()) continue;
    LATENT_ASSIGN_OR_RETURN(std::vector<int64_t> d,
                            one_latent_dims(*t, channels, "denoise: noise / init latents"));
    if (t->device() != be.device())
      return Status::errorf("denoise: noise / init latents ", t->describe(), " are not on ",
                            be.name());
    if (t == &req.noise) {
      h = d[2];
      w = d[3];
    } else if (d[2] != h || d[3] != w) {
      return Status::errorf("denoise: init latents ", shape_str(t->shape()), " do not match the ",
                            h, " x ", w, " noise");
    }
  }
  LATENT_TRY(check_target(h, w, req.strength, req.init_latents.defined()));
  const DenoisePrompts& pr = *req.prompts;
  const bool cfg_on = pr.has_negative && req.true_cfg_scale > 1.f;

  const int64_t tokens = (h / 2) * (w / 2);
  DeviceDenoiseResult result;
  LATENT_ASSIGN_OR_RETURN(result.schedule,
                          qwen_image_schedule(scheduler, req.steps, tokens, req.strength));
  const FlowMatchSchedule& s = result.schedule;

  // latents: [1, T, 4C]; img2img: scale_noise at the first step run, sigma * noise + (1 - sigma)
  // * image (elementwise, so on the packed tokens)
  LATENT_ASSIGN_OR_RETURN(Tensor latents, be.pack_latents(req.noise));
  if (req.init_latents.defined()) {
    const float sigma = s.sigmas[static_cast<size_t>(s.begin_index)];
    LATENT_ASSIGN_OR_RETURN(Tensor image, be.pack_latents(req.init_latents));
    LATENT_ASSIGN_OR_RETURN(latents, be.scaled_add(latents, image, sigma, 1.f - sigma));
  }

  // References: packed and concatenated after the target tokens, fixed through the loop.
  std::vector<ImageShape> shapes = {{1, h / 2, w / 2}};
  Tensor refs;
  if (!req.reference_latents.empty()) {
    std::vector<Tensor> packed;
    for (size_t i = 0; i < req.reference_latents.size(); ++i) {
      const Tensor& r = req.reference_latents[i];
      LATENT_ASSIGN_OR_RETURN(
          std::vector<int64_t> d,
          one_latent_dims(r, channels, "denoise: reference latents", str_cat(" ", i)));
      auto p = be.pack_latents(r);
      if (!p.ok()) return p.status().with_context(str_cat("denoise: reference latents ", i));
      packed.push_back(std::move(*p));
      shapes.push_back({1, d[2] / 2, d[3] / 2});
    }
    if (packed.size() == 1) {
      refs = packed[0];
    } else {
      LATENT_ASSIGN_OR_RETURN(refs, be.concat(packed, 1));
    }
  }

  // Text: the cached prompts; a batched pair without CFG runs its first row alone.
  const bool batched = cfg_on && pr.batched;
  MmditInputs cond, uncond;
  cond.img_shapes = uncond.img_shapes = shapes;
  cond.encoder_hidden_states = pr.cond;
  cond.encoder_hidden_states_mask = pr.cond_mask;
  if (pr.batched && !batched) {
    const int64_t len = pr.cond.dim(1);
    LATENT_ASSIGN_OR_RETURN(cond.encoder_hidden_states, be.slice(pr.cond, 0, 0, 1));
    if (!pr.cond_mask.empty())
      cond.encoder_hidden_states_mask.assign(pr.cond_mask.begin(), pr.cond_mask.begin() + len);
  }
  if (cfg_on && !batched) {
    uncond.encoder_hidden_states = pr.uncond;
    uncond.encoder_hidden_states_mask = pr.uncond_mask;
  }

  // The timestep projections of every step run, uploaded at once: rows per step = the batch,
  // then (zero_cond_t with references) as many t = 0 rows.
  const int total = s.steps_to_run();
  const int64_t batch = batched ? 2 : 1;
  const bool zero_rows = cfg.zero_cond_t && shapes.size() > 1;
  const int64_t rows = zero_rows ? 2 * batch : batch;
  std::vector<float> all_ts;
  for (int i = s.begin_index; i < static_cast<int>(s.timesteps.size()); ++i) {
    const float t = s.timesteps[static_cast<size_t>(i)] / 1000.f;  // the pipelines pass t / 1000
    all_ts.insert(all_ts.end(), static_cast<size_t>(batch), t);
    if (zero_rows) all_ts.insert(all_ts.end(), static_cast<size_t>(batch), 0.f);
  }
  LATENT_ASSIGN_OR_RETURN(Tensor all_proj, model.timestep_projections(all_ts));
  LATENT_INFO("denoise: ", h, " x ", w, " latent (", tokens, " tokens), ",
              req.reference_latents.size(), " reference(s), steps ", s.begin_index + 1, "..",
              s.timesteps.size(), cfg_on ? str_cat(", true CFG ", req.true_cfg_scale) : "",
              batched ? " (batched)" : "", " on ", be.name());

  for (int i = s.begin_index; i < static_cast<int>(s.timesteps.size()); ++i) {
    const int step = i - s.begin_index;
    const float t = s.timesteps[static_cast<size_t>(i)] / 1000.f;
    Tensor proj;  // [rows, 256]
    LATENT_ASSIGN_OR_RETURN(proj, be.slice(all_proj, 0, step * rows, rows));
    // x: [1, T (+ T_ref), 4C]
    Tensor x = latents;
    if (refs.defined()) {
      LATENT_ASSIGN_OR_RETURN(x, be.concat({latents, refs}, 1));
    }
    Tensor pred;
    const std::string when = str_cat("denoise step ", step + 1, " of ", total);
    if (batched) {
      LATENT_ASSIGN_OR_RETURN(cond.hidden_states, be.concat({x, x}, 0));  // [2, T', 4C]
      cond.timestep = {t, t};
      cond.timestep_proj = proj;
      auto out = model.forward(cond);
      if (!out.ok()) return out.status().with_context(when);
      LATENT_ASSIGN_OR_RETURN(Tensor v, be.slice(*out, 0, 0, 1));
      LATENT_ASSIGN_OR_RETURN(Tensor u, be.slice(*out, 0, 1, 1));
      LATENT_ASSIGN_OR_RETURN(v, be.slice(v, 1, 0, tokens));  // [1, T, 4C]
      LATENT_ASSIGN_OR_RETURN(u, be.slice(u, 1, 0, tokens));
      LATENT_ASSIGN_OR_RETURN(pred, be.cfg_combine(v, u, req.true_cfg_scale));
    } else {
      cond.hidden_states = x;
      cond.timestep = {t};
      cond.timestep_proj = proj;
      auto out = model.forward(cond);
      if (!out.ok()) return out.status().with_context(when);
      LATENT_ASSIGN_OR_RETURN(pred, be.slice(*out, 1, 0, tokens));
      if (cfg_on) {
        uncond.hidden_states = x;
        uncond.timestep = {t};
        uncond.timestep_proj = proj;
        auto neg = model.forward(uncond);
        if (!neg.ok()) return neg.status().with_context(when + " (negative prompt)");
        LATENT_ASSIGN_OR_RETURN(Tensor u, be.slice(*neg, 1, 0, tokens));
        LATENT_ASSIGN_OR_RETURN(pred, be.cfg_combine(pred, u, req.true_cfg_scale));
      }
    }
    // FlowMatchEulerDiscreteScheduler.step: x + (sigma_next - sigma) * v
    const float dt = s.sigmas[static_cast<size_t>(i) + 1] - s.sigmas[static_cast<size_t>(i)];
    LATENT_ASSIGN_OR_RETURN(latents, be.scaled_add(latents, pred, 1.f, dt));
    if (progress && !progress(step + 1, total))
      return Status::errorf("denoise: stopped after step ", step + 1, " of ", total);
  }
  LATENT_ASSIGN_OR_RETURN(result.latents, be.unpack_latents(latents, h, w));  // [1, C, h, w]
  return result;
}

Result<DenoiseResult> qwen_image_denoise(QwenImageMmdit& model,
                                         const FlowMatchSchedulerConfig& scheduler,
                                         const DenoiseRequest& req,
                                         const DenoiseProgress& progress) {
  Backend& be = model.backend();
  const QwenImageMmditConfig& cfg = model.config();
  LATENT_ASSIGN_OR_RETURN(const int64_t channels, packed_latent_channels(cfg));

  // Target size: given, else from the noise or init latents.
  int64_t h = req.height, w = req.width;
  for (const Tensor* t : {&req.noise, &req.init_latents}) {
    if (!t->defined()) continue;
    LATENT_ASSIGN_OR_RETURN(std::vector<int64_t> d,
                            one_latent_dims(*t, channels, "denoise: noise / init latents"));
    if (h == 0 && w == 0) {
      h = d[2];
      w = d[3];
    } else if (d[2] != h || d[3] != w) {
      return Status::errorf("denoise: noise / init latents ", shape_str(t->shape()),
                            " do not match the ", h, " x ", w, " target latent");
    }
  }
  LATENT_TRY(check_target(h, w, req.strength, req.init_latents.defined()));
  LATENT_TRY(check_prompt(req.prompt, "prompt embeds", cfg.joint_attention_dim));
  const bool cfg_on = req.negative.defined() && req.true_cfg_scale > 1.f;
  if (req.negative.defined())
    LATENT_TRY(check_prompt(req.negative, "negative prompt embeds", cfg.joint_attention_dim));

  DenoiseResult result;
  // Initial noise [1, C, 1, h, w] on the host (returned), then everything on the backend.
  if (req.noise.defined()) {
    result.noise = Tensor::from_floats({1, channels, 1, h, w}, req.noise.to_floats());
  } else {
    // randn_tensor((1, 1, C, h, w), generator): the same memory as [1, C, 1, h, w].
    LATENT_ASSIGN_OR_RETURN(Tensor n, torch_randn({1, 1, channels, h, w}, req.seed));
    LATENT_ASSIGN_OR_RETURN(result.noise, n.reshape({1, channels, 1, h, w}));
  }
  LATENT_ASSIGN_OR_RETURN(
      DenoisePrompts prompts,
      upload_denoise_prompts(model, req.prompt, cfg_on ? req.negative : PromptEmbeds(),
                             req.batch_cfg));
  DeviceDenoiseRequest dreq;
  dreq.steps = req.steps;
  dreq.strength = req.strength;
  dreq.true_cfg_scale = req.true_cfg_scale;
  dreq.prompts = &prompts;
  LATENT_ASSIGN_OR_RETURN(dreq.noise, upload_latent(be, result.noise));
  if (req.init_latents.defined()) {
    auto init = upload_latent(be, req.init_latents);
    if (!init.ok()) return init.status().with_context("denoise: init latents");
    dreq.init_latents = std::move(*init);
  }
  for (size_t i = 0; i < req.reference_latents.size(); ++i) {
    const Tensor& r = req.reference_latents[i];
    LATENT_TRY(
        one_latent_dims(r, channels, "denoise: reference latents", str_cat(" ", i)).status());
    auto up = upload_latent(be, r);
    if (!up.ok()) return up.status().with_context(str_cat("denoise: reference latents ", i));
    dreq.reference_latents.push_back(std::move(*up));
  }
  LATENT_ASSIGN_OR_RETURN(DeviceDenoiseResult out,
                          qwen_image_denoise_on_backend(model, scheduler, dreq, progress));
  result.schedule = std::move(out.schedule);
  LATENT_ASSIGN_OR_RETURN(Tensor host, be.download(out.latents));  // [1, C, h, w] fp32
  LATENT_ASSIGN_OR_RETURN(result.latents, host.reshape({1, channels, 1, h, w}));
  return result;
}

Result<Tensor> decode_latents(VaeModel& vae, const Tensor& latents) {
  LATENT_ASSIGN_OR_RETURN(std::vector<int64_t> d, latent_dims(latents, "decode: latents"));
  const LatentSpace& space = vae.latent_space();
  if (d[1] != space.channels)
    return Status::errorf("decode: ", d[1], "-channel latents for a VAE of ", space.channels,
                          " channels (", space.name, ")");
  Backend& be = vae.backend();
  // [1, C, 1, h, w] -> z: [1, C, h, w]
  LATENT_ASSIGN_OR_RETURN(
      Tensor z, be.upload(Tensor::from_floats({d[0], d[1], d[2], d[3]}, latents.to_floats())));
  LATENT_ASSIGN_OR_RETURN(z, space.denormalize(be, z));
  LATENT_ASSIGN_OR_RETURN(Tensor x, vae.decode(z));  // [1, 3, H, W]
  return be.download(x);
}

}  // namespace latent
