// TAEHV / TAEW tiny video autoencoders as taehv.py computes them (see taehv.h for the layout and
// the frame conventions), streamed frame by frame: every MemBlock keeps the input of the
// previous frame, every TPool the partial sum of the frames of its current group, so memory
// does not depend on the clip's length.
//
// Exact rewrites of taehv.py's layers onto the backend's ops (no channel concatenation needed):
//   MemBlock  conv(cat[x, past]) = conv(x, W[:, :c]) + conv(past, W[:, c:])  (past = 0 first)
//   TPool     conv(cat[x_0 .. x_s-1]) = sum_i conv(x_i, W[:, i*c:(i+1)*c]), summed as frames come
//   TGrow     frame i of its output = conv(x, W[i*c:(i+1)*c]), each made when it is needed
//   Upsample after TGrow: a 1x1 conv commutes with nearest upsampling, so TGrow runs first, at
//             the low resolution (4x fewer operations, bit-identical per pixel)
//   pixel_unshuffle(p) then the first 3x3 conv = one 3p x 3p conv of stride p on the frame
//   The decoder's trimmed first frames stop after the last TGrow (nothing after it keeps state),
//   so image-mode decode() runs the full-resolution layers once, not 4 times.
#include "engine/models/vae/taehv.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "engine/core/env.h"
#include "engine/core/log.h"
#include "engine/models/vae/architectures.h"
#include "engine/models/vae/upsample_conv.h"
#include "engine/models/vae/vae.h"
#include "engine/models/vae/vae_common.h"
#include "engine/weights/binder.h"

namespace latent {

namespace {

using vae_common::Conv;

std::string key(const char* part, int index, const std::string& rest) {
  return str_cat(part, ".", index, rest.empty() ? "" : ".", rest);
}

const TensorRecord* rank4(const WeightStore& w, const std::string& name) {
  const TensorRecord* r = w.find(name);
  return r && r->shape.size() == 4 ? r : nullptr;
}

std::string lower_file_name(const std::string& path) {
  size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::transform(base.begin(), base.end(), base.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return base;
}

bool contains(const std::string& s, const char* needle) {
  return s.find(needle) != std::string::npos;
}

// ---- Host-side weight surgery (fp32 host tensors from WeightBinder::take_host) --------------

// Entries [start, start + count) along dim 0 or 1 of a 4-D tensor.
Tensor host_slice(const Tensor& w, int dim, int64_t start, int64_t count) {
  Shape s = w.shape();
  const int64_t outer = dim == 0 ? 1 : s[0];
  const int64_t rows = s[dim];
  const int64_t inner = shape_numel(s) / (outer * rows);
  s[dim] = count;
  Tensor out = Tensor::empty(s, DType::kF32);
  const float* src = w.data_as<float>();
  float* dst = out.data_as<float>();
  for (int64_t o = 0; o < outer; ++o)
    std::copy(src + (o * rows + start) * inner, src + (o * rows + start + count) * inner,
              dst + o * count * inner);
  return out;
}

// The weight [O, C*p*p, 3, 3] of a 3x3 conv applied after pixel_unshuffle(p) as the weight
// [O, C, 3p, 3p] of one conv with stride p and padding p on the frame itself:
// W'[o, c, p*ky + dy, p*kx + dx] = W[o, c*p*p + dy*p + dx, ky, kx].
Tensor fold_unshuffle(const Tensor& w, int p) {
  const int64_t o_n = w.dim(0), c_n = w.dim(1) / (p * p), k = 3 * p;
  Tensor out = Tensor::zeros({o_n, c_n, k, k}, DType::kF32);
  const float* src = w.data_as<float>();
  float* dst = out.data_as<float>();
  for (int64_t o = 0; o < o_n; ++o)
    for (int64_t c = 0; c < c_n; ++c)
      for (int dy = 0; dy < p; ++dy)
        for (int dx = 0; dx < p; ++dx)
          for (int ky = 0; ky < 3; ++ky)
            for (int kx = 0; kx < 3; ++kx) {
              const int64_t ci = c * p * p + dy * p + dx;
              dst[((o * c_n + c) * k + p * ky + dy) * k + p * kx + dx] =
                  src[((o * w.dim(1) + ci) * 3 + ky) * 3 + kx];
            }
  return out;
}

// ---- Layers ----------------------------------------------------------------------------------

// taehv.py MemBlock(n_in, n_out).
struct MemBlock {
  Conv x_half;     // conv.0 over x, with conv.0's bias
  Conv past_half;  // conv.0 over the previous frame's x
  Conv conv2, conv4;
  std::optional<Conv> skip;  // 1x1, when n_in != n_out

  // x, past: [N, n_in, H, W] (past undefined: the clip's first frame, zeros in taehv.py)
  // -> [N, n_out, H, W]
  Result<Tensor> forward(Backend& be, const Tensor& x, const Tensor& past) const {
    Tensor pre;
    if (past.defined()) {
      LATENT_ASSIGN_OR_RETURN(pre, past_half(be, past));
    }
    LATENT_ASSIGN_OR_RETURN(Tensor h, x_half(be, x, pre, Activation::kReLU));
    LATENT_ASSIGN_OR_RETURN(h, conv2(be, h, Tensor(), Activation::kReLU));
    Tensor skipped = x;
    if (skip) {
      LATENT_ASSIGN_OR_RETURN(skipped, (*skip)(be, x));
    }
    return conv4(be, h, skipped, Activation::kReLU);  // ReLU(conv(h) + skip(x))
  }
};

enum class Kind { kConv, kClamp, kMemBlock, kPool, kGrow, kUpsample };

struct Layer {
  Kind kind = Kind::kConv;
  int index = 0;  // taehv.py's Sequential index, for messages
  Conv conv;      // kConv
  Activation act = Activation::kNone;
  MemBlock mem;                 // kMemBlock
  std::vector<Conv> per_frame;  // kPool: the weight over input frame i; kGrow: output frame i
  // kGrow of the decoder: the closing conv two layers on (after the Upsample) composed with
  // per_frame[i] (see load_decoder), each an upsampling convolution (upsample_conv.h); empty
  // where the layers do not follow that pattern.
  std::vector<UpsampleConv> folded;
};

// One part (encoder or decoder) as the list of layers a frame flows through.
struct Net {
  std::vector<Layer> layers;
  // The first layer after which no layer keeps state (MemBlock, TPool, TGrow): a frame that
  // will be dropped anyway (the decoder's trimmed first frames) stops there.
  size_t stateless_tail = 0;
  void finalise() {
    stateless_tail = 0;
    for (size_t i = 0; i < layers.size(); ++i)
      if (layers[i].kind == Kind::kMemBlock || layers[i].kind == Kind::kPool ||
          layers[i].kind == Kind::kGrow)
        stateless_tail = i + 1;
  }
};

// What one clip in progress keeps per layer.
struct NetState {
  std::vector<Tensor> memory;  // kMemBlock: the previous frame's input; kPool: the partial sum
  std::vector<int> pooled;     // kPool: frames summed into memory so far
  int64_t drop = 0;            // frames still to drop at the net's stateless tail
  void reset(size_t layers, int64_t drop_first = 0) {
    memory.assign(layers, Tensor());
    pooled.assign(layers, 0);
    drop = drop_first;
  }
};

// taehv.py's Clamp: torch.tanh(x / 3) * 3 (0 stays 0).
Result<Tensor> soft_clamp(Backend& be, const Tensor& in) {
  LATENT_ASSIGN_OR_RETURN(Tensor x, be.affine(in, 1.f / 3.f, 0.f));
  LATENT_ASSIGN_OR_RETURN(x, be.activation(x, Activation::kTanh));
  return be.affine(x, 3.f, 0.f);
}

// Whether the decoder runs its TGrow layers folded into the closing convs (Layer::folded):
// LATENT_TAEHV_FOLD_GROW=0 runs them as taehv.py does (1x1 conv, upsample, conv), for A/B runs.
bool fold_grow() {
  static const bool on = env_choice("LATENT_TAEHV_FOLD_GROW", {{"1"}, {"0"}}, 0) == 0;
  return on;
}

// Feeds frame x: [N, C, H, W] into layer i of `net`; the frames that leave the last layer are
// appended to *out (none while a pool waits for frames, several after a grow).
Status run_frame(Backend& be, const Net& net, NetState& st, Tensor x, size_t i,
                 std::vector<Tensor>* out) {
  for (; i < net.layers.size(); ++i) {
    if (i == net.stateless_tail && st.drop > 0) {  // a trimmed frame: nothing after needs it
      --st.drop;
      return ok_status();
    }
    const Layer& l = net.layers[i];
    switch (l.kind) {
      case Kind::kConv: {
        LATENT_ASSIGN_OR_RETURN(x, l.conv(be, x, Tensor(), l.act));
        break;
      }
      case Kind::kClamp: {
        LATENT_ASSIGN_OR_RETURN(x, soft_clamp(be, x));
        break;
      }
      case Kind::kMemBlock: {
        Tensor past = st.memory[i];
        st.memory[i] = x;
        LATENT_ASSIGN_OR_RETURN(x, l.mem.forward(be, x, past));
        break;
      }
      case Kind::kPool: {
        const int k = st.pooled[i];
        LATENT_ASSIGN_OR_RETURN(Tensor sum, l.per_frame[k](be, x, st.memory[i]));
        if (k + 1 < static_cast<int>(l.per_frame.size())) {
          st.memory[i] = sum;
          st.pooled[i] = k + 1;
          return ok_status();  // waits for the group's next frame
        }
        st.memory[i] = Tensor();
        st.pooled[i] = 0;
        x = sum;
        break;
      }
      case Kind::kGrow: {
        // Frame by frame, each through the rest of the net before the next is made (the order
        // taehv.py's sequential mode visits them; MemBlocks only see their own layer's order).
        if (!l.folded.empty() && fold_grow()) {
          // kGrow, kUpsample, kConv as conv_i(up(x)). After the last grow only stateless
          // layers follow (the full-resolution head): one upsample serves every grown frame.
          // Earlier, each grown frame runs the rest of the decoder before the next, and an
          // upsample kept alive meanwhile would add to the peak: one each.
          // (Run as phases, no upsampled tensor is made at all.)
          const Layer& closing = net.layers[i + 2];
          const bool share = i + 1 == net.stateless_tail;
          Tensor up;
          for (const UpsampleConv& c : l.folded) {
            if (share && st.drop > 0) {  // a trimmed frame
              --st.drop;
              continue;
            }
            Tensor y;
            if (c.phases) {
              LATENT_ASSIGN_OR_RETURN(y, c(be, x, closing.act));
            } else {
              if (!up.defined()) {
                LATENT_ASSIGN_OR_RETURN(up, be.upsample_nearest2x(x));
              }
              LATENT_ASSIGN_OR_RETURN(y, c.on_upsampled(be, up, closing.act));
              if (!share) up = Tensor();
            }
            LATENT_TRY(run_frame(be, net, st, std::move(y), i + 3, out));
          }
          return ok_status();
        }
        for (const Conv& c : l.per_frame) {
          LATENT_ASSIGN_OR_RETURN(Tensor y, c(be, x));
          LATENT_TRY(run_frame(be, net, st, std::move(y), i + 1, out));  // y freed as it goes
        }
        return ok_status();
      }
      case Kind::kUpsample: {
        LATENT_ASSIGN_OR_RETURN(x, be.upsample_nearest2x(x));
        break;
      }
    }
  }
  out->push_back(std::move(x));
  return ok_status();
}

// ---- Frames of a clip and the backend's image layout -----------------------------------------
// Clips are [N, C, T, H, W] row-major (as upload() keeps 5-D tensors); the layers take frames
// [N, C, H, W] in the backend's own image layout (NHWC on CUDA). Conversions with backend ops:
struct FrameIo {
  Backend& be;
  Layout layout;  // what upload() makes of a 4-D tensor

  // clip: [N, C, T, H, W] -> frame t: [N, C, H, W] in the image layout. An odd H or W comes
  // back one larger, padded with zeros at the bottom / right (*pad_bottom, *pad_right: 0 or 1),
  // which a following 3x3 convolution with that much less padding there reads as its own
  // zero padding: pack_latents / unpack_latents (the device-side permutation) take even sides.
  // `zeros` caches the padding rows of the clip's shape.
  Result<Tensor> frame(const Tensor& clip, int64_t t, int* pad_bottom, int* pad_right,
                       std::vector<Tensor>* zeros) const {
    const Shape& s = clip.shape();
    *pad_bottom = static_cast<int>(s[3] % 2);
    *pad_right = static_cast<int>(s[4] % 2);
    LATENT_ASSIGN_OR_RETURN(Tensor f, be.slice(clip, 2, t, 1));  // [N, C, 1, H, W]
    if (!*pad_bottom && !*pad_right && layout == Layout::kContiguous)
      return f.reshape({s[0], s[1], s[3], s[4]});
    const int64_t h = s[3] + *pad_bottom, w = s[4] + *pad_right;
    if (zeros->empty()) {
      // [N, C, 1, 1, W] below, then [N, C, 1, H + 1, 1] on the right.
      for (const Shape& z : {Shape{s[0], s[1], 1, 1, s[4]}, Shape{s[0], s[1], 1, h, 1}}) {
        LATENT_ASSIGN_OR_RETURN(Tensor zt, be.upload(Tensor::zeros(z, DType::kF32)));
        zeros->push_back(std::move(zt));
      }
    }
    if (*pad_bottom) {
      LATENT_ASSIGN_OR_RETURN(f, be.concat({f, (*zeros)[0]}, 3));
    }
    if (*pad_right) {
      LATENT_ASSIGN_OR_RETURN(f, be.concat({f, (*zeros)[1]}, 4));
    }
    // pack_latents reads [N, C, 1, h, w] row-major, unpack_latents writes the image layout;
    // together a pure permutation.
    LATENT_ASSIGN_OR_RETURN(Tensor tokens, be.pack_latents(f));
    return be.unpack_latents(tokens, h, w);
  }

  // frames: T x [N, C, H, W] in the image layout -> [N, C, T, H, W] row-major
  Result<Tensor> clip(const std::vector<Tensor>& frames) const {
    const Shape& s = frames.front().shape();
    const int64_t n = s[0], c = s[1], h = s[2], w = s[3];
    auto cat = [&](const std::vector<Tensor>& parts, int dim) -> Result<Tensor> {
      if (parts.size() == 1) return parts[0];
      return be.concat(parts, dim);
    };
    if (layout == Layout::kContiguous || c == 1 || h * w == 1) {
      std::vector<Tensor> parts;
      for (const Tensor& f : frames) {
        // A 4-D tensor whose layouts agree (contiguous, one channel or one pixel) read row-major.
        parts.push_back(Tensor::from_storage(f.storage(), f.byte_offset(), {n, c, 1, h, w},
                                             f.dtype(), Layout::kContiguous));
      }
      return cat(parts, 2);
    }
    if (n == 1) {
      // One clip: the frames joined along dim 0 ([T, C, H, W]) and transposed once.
      Tensor joined = frames.front();
      if (frames.size() > 1) {
        LATENT_ASSIGN_OR_RETURN(joined, be.concat(frames, 0));
      }
      Result<Tensor> clip = be.frames_to_clip(joined);
      if (clip.ok()) return clip;
    }
    // Channels-last: one channel of a frame is row-major; gather [N, 1, T, H, W] per channel.
    std::vector<Tensor> channels;
    for (int64_t ch = 0; ch < c; ++ch) {
      std::vector<Tensor> planes;
      for (const Tensor& f : frames) {
        LATENT_ASSIGN_OR_RETURN(Tensor p, be.slice_channels(f, ch, 1));  // [N, 1, H, W]
        planes.push_back(Tensor::from_storage(p.storage(), p.byte_offset(), {n, 1, 1, h, w},
                                              p.dtype(), Layout::kContiguous));
      }
      LATENT_ASSIGN_OR_RETURN(Tensor plane, cat(planes, 2));
      channels.push_back(std::move(plane));
    }
    return cat(channels, 1);
  }

  // pixel_shuffle: [N, C*p*p, h, w] -> [N, C, h*p, w*p]
  Result<Tensor> pixel_shuffle(const Tensor& x, int p) const {
    const int64_t n = x.dim(0), cp = x.dim(1), h = x.dim(2), w = x.dim(3), c = cp / (p * p);
    if (layout == Layout::kNHWC && p == 2) {
      // Channels-last [N, h, w, 4C] is unpack_latents' token form [N, h*w, 4C] with the 2x2
      // patch channels-major (c, dy, dx): pixel_shuffle's order.
      Tensor tokens = Tensor::from_storage(x.storage(), x.byte_offset(), {n, h * w, cp}, x.dtype(),
                                           Layout::kContiguous);
      return be.unpack_latents(tokens, 2 * h, 2 * w);
    }
    LATENT_ASSIGN_OR_RETURN(Tensor host, be.download(x));  // [N, C*p*p, h, w] fp32
    Tensor y = Tensor::empty({n, c, h * p, w * p}, DType::kF32);
    const float* src = host.data_as<float>();
    float* dst = y.data_as<float>();
    for (int64_t b = 0; b < n; ++b)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int dy = 0; dy < p; ++dy)
          for (int dx = 0; dx < p; ++dx) {
            const float* plane = src + ((b * cp) + ch * p * p + dy * p + dx) * h * w;
            for (int64_t i = 0; i < h; ++i)
              for (int64_t j = 0; j < w; ++j)
                dst[((b * c + ch) * h * p + i * p + dy) * w * p + j * p + dx] = plane[i * w + j];
          }
    return be.upload(y);
  }
};

// ---- Loading ---------------------------------------------------------------------------------

Conv take_conv(WeightBinder& b, const std::string& name, int64_t cout, int64_t cin, int k,
               bool bias, Conv2dParams p) {
  return vae_common::load_conv(b, name, cout, cin, k, bias, p);
}

Conv upload_conv(Backend& be, const Tensor& host_w, Conv2dParams p, Tensor bias, Status* st) {
  Conv c;
  auto w = be.upload(host_w);
  if (!w.ok()) {
    if (st->ok()) *st = w.status();
    return c;
  }
  c.w = *w;
  c.b = std::move(bias);
  c.p = p;
  return c;
}

MemBlock load_memblock(WeightBinder& b, Backend& be, const std::string& name, int64_t cin,
                       int64_t cout, Status* st) {
  MemBlock m;
  Tensor w0 = b.take_host(name + ".conv.0.weight", {cout, 2 * cin, 3, 3});
  Tensor b0 = b.take(name + ".conv.0.bias", {cout});
  if (w0.defined()) {
    // taehv.py concatenates [x, past] along channels: the first cin input channels read x.
    m.x_half = upload_conv(be, host_slice(w0, 1, 0, cin), Conv2dParams::same(3), b0, st);
    m.past_half = upload_conv(be, host_slice(w0, 1, cin, cin), Conv2dParams::same(3), Tensor(), st);
  }
  m.conv2 = take_conv(b, name + ".conv.2", cout, cout, 3, true, Conv2dParams::same(3));
  m.conv4 = take_conv(b, name + ".conv.4", cout, cout, 3, true, Conv2dParams::same(3));
  if (cin != cout)
    m.skip = take_conv(b, name + ".skip", cout, cin, 1, false, Conv2dParams::same(1));
  return m;
}

Layer conv_layer(int index, Conv c, Activation act = Activation::kNone) {
  Layer l;
  l.kind = Kind::kConv;
  l.index = index;
  l.conv = std::move(c);
  l.act = act;
  return l;
}

Layer mem_layer(int index, MemBlock m) {
  Layer l;
  l.kind = Kind::kMemBlock;
  l.index = index;
  l.mem = std::move(m);
  return l;
}

Layer simple_layer(int index, Kind kind) {
  Layer l;
  l.kind = kind;
  l.index = index;
  return l;
}

// taehv.py's encoder Sequential (see taehv.h for the indices).
Net load_encoder(WeightBinder& b, Backend& be, const TaehvConfig& cfg, Status* st) {
  Net net;
  const int64_t w = cfg.encoder_width;
  const int p = cfg.patch_size;
  const int64_t in = cfg.image_channels * p * p;
  // 0: conv(3p^2 -> w) + 1: ReLU, with the pixel_unshuffle folded in when p > 1.
  Tensor w0 = b.take_host("encoder.0.weight", {w, in, 3, 3});
  Tensor b0 = b.take("encoder.0.bias", {w});
  if (w0.defined()) {
    Conv2dParams cp = Conv2dParams::same(3);
    Tensor wf = w0;
    if (p > 1) {
      wf = fold_unshuffle(w0, p);
      cp.stride = p;
      cp.pad_top = cp.pad_bottom = cp.pad_left = cp.pad_right = p;
    }
    net.layers.push_back(conv_layer(0, upload_conv(be, wf, cp, b0, st), Activation::kReLU));
  }
  for (int j = 0; j < 3; ++j) {
    const int base = 2 + 5 * j;
    const int s = cfg.encoder_pool[j];
    Layer pool = simple_layer(base, Kind::kPool);
    Tensor pw = b.take_host(key("encoder", base, "conv.weight"), {w, w * s, 1, 1});
    if (pw.defined())
      for (int i = 0; i < s; ++i)  // reshape(-1, s*C, H, W): frame i is channels [i*C, (i+1)*C)
        pool.per_frame.push_back(
            upload_conv(be, host_slice(pw, 1, i * w, w), Conv2dParams::same(1), Tensor(), st));
    net.layers.push_back(std::move(pool));
    net.layers.push_back(conv_layer(base + 1, take_conv(b, key("encoder", base + 1, ""), w, w, 3,
                                                        false, Conv2dParams::same(3, 2))));
    for (int k = 2; k < 5; ++k)
      net.layers.push_back(
          mem_layer(base + k, load_memblock(b, be, key("encoder", base + k, ""), w, w, st)));
  }
  net.layers.push_back(conv_layer(
      17, take_conv(b, "encoder.17", cfg.latent_channels, w, 3, true, Conv2dParams::same(3))));
  net.finalise();
  return net;
}

// taehv.py's decoder Sequential (see taehv.h), with each Upsample moved after its TGrow.
Net load_decoder(WeightBinder& b, Backend& be, const TaehvConfig& cfg, Status* st) {
  Net net;
  const auto& n = cfg.decoder_widths;
  net.layers.push_back(simple_layer(0, Kind::kClamp));
  net.layers.push_back(conv_layer(
      1, take_conv(b, "decoder.1", n[0], cfg.latent_channels, 3, true, Conv2dParams::same(3)),
      Activation::kReLU));  // 2: ReLU
  for (int j = 0; j < 3; ++j) {
    const int base = 3 + 6 * j;
    const int64_t c = n[j];
    for (int k = 0; k < 3; ++k)
      net.layers.push_back(
          mem_layer(base + k, load_memblock(b, be, key("decoder", base + k, ""), c, c, st)));
    const int s = cfg.decoder_grow[j];
    Layer grow = simple_layer(base + 4, Kind::kGrow);
    const std::string gname = key("decoder", base + 4, "conv.weight");
    Tensor gw = b.take_host(gname, {});
    if (gw.defined()) {
      // taehv.py's patch_tgrow_layers: a stored weight with more output channels than s*c keeps
      // its last s*c (the last time steps).
      if (gw.rank() != 4 || gw.dim(1) != c || gw.dim(2) != 1 || gw.dim(3) != 1 ||
          gw.dim(0) < s * c || gw.dim(0) % c != 0) {
        if (st->ok())
          *st = Status::errorf("tensor '", gname, "' has shape ", shape_str(gw.shape()),
                               ", expected [", s * c, ", ", c, ", 1, 1] (TGrow of stride ", s,
                               " over ", c, " channels)");
      } else {
        const int64_t first = gw.dim(0) - s * c;
        for (int i = 0; i < s; ++i)
          grow.per_frame.push_back(upload_conv(be, host_slice(gw, 0, first + i * c, c),
                                               Conv2dParams::same(1), Tensor(), st));
      }
    }
    // The stage's closing conv (no bias); after the last one, 21: ReLU.
    const std::string cname = key("decoder", base + 5, "weight");
    Tensor cw = b.take_host(cname, {n[j + 1], c, 3, 3});
    if (gw.defined() && cw.defined() && static_cast<int>(grow.per_frame.size()) == s) {
      // TGrow's 1x1 convs, the Upsample and this conv are linear with nothing between them:
      // conv(up(G_i x)) = conv_i(up(x)) with conv_i's weight W . G_i (summed over W's input
      // channels). One upsample then serves every grown frame, and no 1x1 conv runs.
      const int64_t first = gw.dim(0) - s * c;
      const float* wp = cw.data_as<float>();
      for (int i = 0; i < s; ++i) {
        Tensor g = host_slice(gw, 0, first + i * c, c);  // [m = c, ci = c, 1, 1]
        const float* gp = g.data_as<float>();
        Tensor wi = Tensor::zeros({n[j + 1], c, 3, 3}, DType::kF32);
        float* out = wi.data_as<float>();
        for (int64_t co = 0; co < n[j + 1]; ++co)
          for (int64_t m = 0; m < c; ++m)
            for (int64_t ci = 0; ci < c; ++ci) {
              const float gv = gp[m * c + ci];
              for (int t = 0; t < 9; ++t)
                out[(co * c + ci) * 9 + t] += wp[(co * c + m) * 9 + t] * gv;
            }
        Result<UpsampleConv> folded = make_upsample_conv(be, wi, Tensor());
        if (!folded.ok()) {
          if (st->ok()) *st = folded.status().with_context(str_cat("'", cname, "' folded"));
          break;
        }
        grow.folded.push_back(std::move(folded).value());
      }
    }
    net.layers.push_back(std::move(grow));
    net.layers.push_back(simple_layer(base + 3, Kind::kUpsample));
    net.layers.push_back(conv_layer(
        base + 5, cw.defined() ? upload_conv(be, cw, Conv2dParams::same(3), Tensor(), st) : Conv{},
        j == 2 ? Activation::kReLU : Activation::kNone));
  }
  const int64_t out = cfg.image_channels * cfg.patch_size * cfg.patch_size;
  // 22: conv(64 -> 3p^2), with the map from taehv.py's [0, 1] to our [-1, 1] (2y - 1) folded in:
  // weights x 2 (exact), bias 2b - 1. The clamp stays in postprocess().
  Tensor w22 = b.take_host("decoder.22.weight", {out, n[3], 3, 3});
  Tensor b22 = b.take_host("decoder.22.bias", {out});
  if (w22.defined() && b22.defined()) {
    float* wp = w22.data_as<float>();
    for (int64_t i = 0; i < w22.numel(); ++i) wp[i] *= 2.f;
    float* bp = b22.data_as<float>();
    for (int64_t i = 0; i < b22.numel(); ++i) bp[i] = 2.f * bp[i] - 1.f;
    Tensor bias;
    if (auto up = be.upload(b22); up.ok()) {
      bias = *up;
    } else if (st->ok()) {
      *st = up.status();
    }
    net.layers.push_back(
        conv_layer(22, upload_conv(be, w22, Conv2dParams::same(3), std::move(bias), st)));
  }
  net.finalise();
  return net;
}

// ---- The model and its streams ---------------------------------------------------------------

class TaehvModel;

// Refers to its model, which must outlive it (as for every VaeStream of a VaeModel).
class TaehvStream final : public VaeStream {
 public:
  TaehvStream(TaehvModel& model, bool encoder);
  Result<Tensor> push(const Tensor& x) override;
  Result<Tensor> finish(int* padded_frames) override;
  void reset() override;
  int frames_buffered() const override { return encoder_ ? static_cast<int>(seen_ % factor_) : 0; }
  int64_t frames_seen() const override { return seen_; }

 private:
  Status encode_frame(const Tensor& frame, std::vector<Tensor>* out);

  TaehvModel& model_;
  bool encoder_;
  int factor_;
  NetState state_;
  int64_t seen_ = 0;
  Shape first_;                // the first push's shape (N, H, W must stay)
  Tensor last_frame_;          // encoder: the last input frame (in [0, 1]), repeated by finish()
  std::vector<Tensor> zeros_;  // FrameIo::frame's padding of odd sides, for this clip's shape
};

class TaehvModel final : public VaeModel {
 public:
  TaehvModel(std::shared_ptr<Backend> backend, TaehvConfig cfg, Layout layout)
      : cfg_(std::move(cfg)), io_{*backend, layout} {
    backend_ = std::move(backend);
  }
  const ModelInfo& info() const override { return info_; }
  bool has_encoder() const override { return encoder_.has_value(); }
  bool has_decoder() const override { return decoder_.has_value(); }
  int temporal_factor() const override { return cfg_.temporal_factor(); }

  Result<std::unique_ptr<VaeStream>> open_stream(bool encoder) override {
    LATENT_TRY(check_part(encoder));
    return std::unique_ptr<VaeStream>(new TaehvStream(*this, encoder));
  }

  // sample: [N, 3, H, W] in [-1, 1] -> [N, C, H/f, W/f]: a clip of this one frame.
  Result<Tensor> encode(const Tensor& sample) override {
    LATENT_TRY(check_part(true));
    LATENT_TRY(
        vae_common::check_encode_sample(*backend_, sample, cfg_.image_channels, cfg_.downsample()));
    LATENT_ASSIGN_OR_RETURN(Tensor x, backend_->affine(sample, 0.5f, 0.5f));
    NetState st;
    st.reset(encoder_->layers.size());
    std::vector<Tensor> out;
    // taehv.py's encode_video pads a one-frame clip to the temporal factor by repetition.
    for (int i = 0; i < cfg_.temporal_factor(); ++i)
      LATENT_TRY(run_frame(*backend_, *encoder_, st, x, 0, &out));
    if (out.size() != 1)
      return Status::errorf("internal error: a one-frame clip gave ", out.size(), " latent frames");
    return out[0];
  }

  // latent: [N, C, h, w] -> [N, 3, h*f, w*f]: the one frame a one-latent clip decodes to.
  Result<Tensor> decode(const Tensor& latent) override {
    LATENT_TRY(check_part(false));
    LATENT_TRY(vae_common::check_decode_latent(*backend_, latent, cfg_.latent_channels));
    NetState st;
    st.reset(decoder_->layers.size(), cfg_.temporal_upscale() - 1);  // taehv.py's frames_to_trim
    std::vector<Tensor> raw;
    LATENT_TRY(run_frame(*backend_, *decoder_, st, latent, 0, &raw));
    if (raw.size() != 1)
      return Status::errorf("internal error: one latent frame decoded to ", raw.size(), " frames");
    return postprocess(raw[0]);
  }

  // The decoder's last conv output [N, 3p^2, h, w] (2y - 1 of taehv.py's y) -> frame
  // [N, 3, H, W] in [-1, 1].
  Result<Tensor> postprocess(const Tensor& y) const {
    Tensor x = y;
    if (cfg_.patch_size > 1) {
      LATENT_ASSIGN_OR_RETURN(x, io_.pixel_shuffle(y, cfg_.patch_size));
    }
    // taehv.py clamps to [0, 1]; the last conv already computed 2x - 1 (load_decoder), and
    // [-1, 1] is the same clamp.
    return backend_->clamp(x, -1.f, 1.f);
  }

  Status check_part(bool encoder) const {
    if (encoder ? encoder_.has_value() : decoder_.has_value()) return ok_status();
    return Status::errorf(
        info_.source.given.empty() ? info_.source.weights_path : info_.source.given, ": this ",
        info_.variant, " has no ", encoder ? "encoder" : "decoder", " loaded");
  }

  TaehvConfig cfg_;
  ModelInfo info_;
  FrameIo io_;
  std::optional<Net> encoder_, decoder_;
};

TaehvStream::TaehvStream(TaehvModel& model, bool encoder)
    : model_(model), encoder_(encoder), factor_(model.cfg_.temporal_factor()) {
  reset();
}

void TaehvStream::reset() {
  // The decoder drops the clip's first t_upscale - 1 frames (taehv.py's frames_to_trim).
  if (encoder_)
    state_.reset(model_.encoder_->layers.size());
  else
    state_.reset(model_.decoder_->layers.size(), model_.cfg_.temporal_upscale() - 1);
  seen_ = 0;
  first_.clear();
  last_frame_ = Tensor();
  zeros_.clear();
}

Result<Tensor> TaehvStream::push(const Tensor& x) {
  Backend& be = model_.backend();
  const TaehvConfig& cfg = model_.cfg_;
  const char* what = encoder_ ? "encoder stream" : "decoder stream";
  const int64_t channels = encoder_ ? cfg.image_channels : cfg.latent_channels;
  if (!x.defined() || x.rank() != 5 || x.dim(1) != channels || x.dim(0) < 1 || x.dim(2) < 1 ||
      x.dim(3) < 1 || x.dim(4) < 1)
    return Status::errorf(what, ": expected ", encoder_ ? "frames" : "latents", " [N, ", channels,
                          ", T, H, W], got ",
                          x.defined() ? shape_str(x.shape()) : "an undefined tensor");
  if (x.device() != be.device())
    return Status::errorf(what, ": input is on ", x.device().to_string(), ", the model on ",
                          be.name());
  if (x.layout() != Layout::kContiguous)
    return Status::errorf(what, ": input ", x.describe(), " is not row-major");
  const int f = cfg.downsample();
  if (encoder_ && (x.dim(3) % f != 0 || x.dim(4) % f != 0))
    return Status::errorf(what, ": frame size ", x.dim(4), "x", x.dim(3), " is not a multiple of ",
                          f, " (the VAE's downsampling factor)");
  if (!first_.empty() && (x.dim(0) != first_[0] || x.dim(3) != first_[3] || x.dim(4) != first_[4]))
    return Status::errorf(what, ": push of ", shape_str(x.shape()),
                          " does not continue the clip begun with ", shape_str(first_),
                          " (N, H and W must stay; reset() starts a new clip)");
  if (first_.empty()) first_ = x.shape();

  std::vector<Tensor> out;
  if (encoder_) {
    LATENT_ASSIGN_OR_RETURN(Tensor in, be.affine(x, 0.5f, 0.5f));  // [-1, 1] -> taehv's [0, 1]
    for (int64_t t = 0; t < x.dim(2); ++t) {
      int pad_b = 0, pad_r = 0;  // frame sides are multiples of 8: never padded
      LATENT_ASSIGN_OR_RETURN(Tensor frame, model_.io_.frame(in, t, &pad_b, &pad_r, &zeros_));
      LATENT_TRY(encode_frame(frame, &out));
    }
  } else {
    for (int64_t t = 0; t < x.dim(2); ++t) {
      int pad_b = 0, pad_r = 0;
      LATENT_ASSIGN_OR_RETURN(Tensor frame, model_.io_.frame(x, t, &pad_b, &pad_r, &zeros_));
      std::vector<Tensor> raw;
      const Net& net = *model_.decoder_;
      if (pad_b || pad_r) {
        // Layers 0 (Clamp) and 1 (the 3x3 conv) read the zero row / column as the conv's padding.
        LATENT_ASSIGN_OR_RETURN(Tensor y, soft_clamp(be, frame));
        const Layer& first = net.layers[1];
        Conv c = first.conv;
        c.p.pad_bottom -= pad_b;
        c.p.pad_right -= pad_r;
        LATENT_ASSIGN_OR_RETURN(y, c(be, y, Tensor(), first.act));
        LATENT_TRY(run_frame(be, net, state_, std::move(y), 2, &raw));
      } else {
        LATENT_TRY(run_frame(be, net, state_, frame, 0, &raw));
      }
      ++seen_;
      for (Tensor& r : raw) {
        LATENT_ASSIGN_OR_RETURN(Tensor y, model_.postprocess(r));
        out.push_back(std::move(y));
      }
    }
  }
  if (out.empty()) return Tensor();
  return model_.io_.clip(out);
}

Status TaehvStream::encode_frame(const Tensor& frame, std::vector<Tensor>* out) {
  LATENT_TRY(run_frame(model_.backend(), *model_.encoder_, state_, frame, 0, out));
  last_frame_ = frame;
  ++seen_;
  return ok_status();
}

Result<Tensor> TaehvStream::finish(int* padded_frames) {
  if (padded_frames) *padded_frames = 0;
  if (!encoder_ || seen_ == 0) {
    reset();
    return Tensor();
  }
  // Pad to the next 1 + F*k frames (reported; a decoder drops them again), then as taehv.py's
  // encode_video pads that clip: to a multiple of F (F - 1 more frames).
  const int64_t t = seen_;
  const int64_t k = (t - 1 + factor_ - 1) / factor_;
  const int64_t padded = 1 + factor_ * k - t;
  const int64_t total = 1 + factor_ * k + (factor_ - 1);
  std::vector<Tensor> out;
  const Tensor last = last_frame_;
  for (int64_t i = t; i < total; ++i) LATENT_TRY(encode_frame(last, &out));
  if (out.empty()) {
    reset();
    return Status::error("internal error: padding the clip produced no latent frame");
  }
  auto clip = model_.io_.clip(out);
  reset();
  if (!clip.ok()) return clip.status();
  if (padded_frames) *padded_frames = static_cast<int>(padded);
  return clip;
}

}  // namespace

// ---- Detection and configuration -------------------------------------------------------------

bool is_taehv_checkpoint(const WeightStore& w) {
  // A MemBlock's first conv reads [x, past]: twice its output channels (TAESD's blocks: equal).
  auto memblock = [&](const std::string& name) {
    const TensorRecord* r = rank4(w, name);
    return r && r->shape[1] == 2 * r->shape[0];
  };
  const bool enc = rank4(w, "encoder.2.conv.weight") && memblock("encoder.4.conv.0.weight");
  const bool dec = rank4(w, "decoder.7.conv.weight") && memblock("decoder.3.conv.0.weight");
  const bool super_dec = w.contains("decoder.1.conv.0.weight") && w.contains("decoder.0.weight");
  return enc || dec || super_dec;
}

Result<TaehvConfig> infer_taehv_config(const WeightStore& w) {
  TaehvConfig cfg;
  const std::string file = lower_file_name(w.path());
  if (w.contains("decoder.1.conv.0.weight"))
    return Status::errorf(w.path(),
                          ": a TAEHV \"super\" decoder (SuperMemBlock, e.g. "
                          "taew2_2_super / taehv1_5_super) is not supported; use taew2_2 / "
                          "taehv1_5");
  if (contains(file, "taecvx") || contains(file, "taeh3") || contains(file, "taeltx"))
    return Status::errorf(w.path(), ": this TAEHV variant (", file,
                          ") uses frame conventions that are not supported (TAEW2.1, TAEW2.2, "
                          "TAEHV and TAEHV1.5 are)");
  auto need = [&](const std::string& name) -> Result<const TensorRecord*> {
    const TensorRecord* r = rank4(w, name);
    if (!r) return Status::errorf(w.path(), ": TAEHV tensor '", name, "' is missing or not 4-D");
    return r;
  };
  auto patch_of = [&](int64_t channels, const std::string& name) -> Result<int> {
    for (int p = 1; p <= 4; ++p)
      if (channels == cfg.image_channels * p * p) return p;
    return Status::errorf(w.path(), ": tensor '", name, "' has ", channels,
                          " image channels, not 3 x p^2 for a patch size p");
  };
  cfg.has_encoder = w.contains("encoder.0.weight");
  cfg.has_decoder = w.contains("decoder.1.weight");
  if (!cfg.has_encoder && !cfg.has_decoder)
    return Status::errorf(w.path(), ": neither 'encoder.0.weight' nor 'decoder.1.weight' found");
  int64_t enc_latent = -1;
  int enc_patch = -1;
  if (cfg.has_encoder) {
    LATENT_ASSIGN_OR_RETURN(const TensorRecord* first, need("encoder.0.weight"));
    LATENT_ASSIGN_OR_RETURN(enc_patch, patch_of(first->shape[1], "encoder.0.weight"));
    cfg.encoder_width = first->shape[0];
    for (int j = 0; j < 3; ++j) {
      const std::string name = key("encoder", 2 + 5 * j, "conv.weight");
      LATENT_ASSIGN_OR_RETURN(const TensorRecord* pool, need(name));
      const int64_t in = pool->shape[1];
      if (in % cfg.encoder_width != 0 || in / cfg.encoder_width < 1 || in / cfg.encoder_width > 2)
        return Status::errorf(w.path(), ": TPool '", name, "' has shape ", shape_str(pool->shape),
                              ", expected [", cfg.encoder_width, ", ", cfg.encoder_width,
                              " x stride (1 or 2), 1, 1]");
      cfg.encoder_pool[j] = static_cast<int>(in / cfg.encoder_width);
    }
    LATENT_ASSIGN_OR_RETURN(const TensorRecord* last, need("encoder.17.weight"));
    enc_latent = last->shape[0];
    cfg.latent_channels = enc_latent;
    cfg.patch_size = enc_patch;
    if (cfg.temporal_factor() != 4)
      return Status::errorf(w.path(), ": the encoder's temporal pools (", cfg.encoder_pool[0], ", ",
                            cfg.encoder_pool[1], ", ", cfg.encoder_pool[2],
                            ") make a temporal factor of ", cfg.temporal_factor(),
                            "; the supported TAEHV files pool by 4 (2, 2, 1)");
  }
  if (cfg.has_decoder) {
    LATENT_ASSIGN_OR_RETURN(const TensorRecord* first, need("decoder.1.weight"));
    cfg.decoder_widths[0] = first->shape[0];
    const int64_t dec_latent = first->shape[1];
    const int idx[3] = {8, 14, 20};
    for (int j = 0; j < 3; ++j) {
      LATENT_ASSIGN_OR_RETURN(const TensorRecord* c, need(key("decoder", idx[j], "weight")));
      cfg.decoder_widths[j + 1] = c->shape[0];
    }
    LATENT_ASSIGN_OR_RETURN(const TensorRecord* last, need("decoder.22.weight"));
    LATENT_ASSIGN_OR_RETURN(int dec_patch, patch_of(last->shape[0], "decoder.22.weight"));
    if (enc_latent >= 0 && (dec_latent != enc_latent || dec_patch != enc_patch))
      return Status::errorf(w.path(), ": the TAEHV encoder makes ", enc_latent,
                            "-channel latents of ", enc_patch, "x", enc_patch,
                            " patches, the decoder reads ", dec_latent, " channels and writes ",
                            dec_patch, "x", dec_patch, " patches");
    cfg.latent_channels = dec_latent;
    cfg.patch_size = dec_patch;
  }
  if (cfg.patch_size > 2 || cfg.latent_channels == 128)
    return Status::errorf(w.path(), ": a TAEHV file with ", cfg.patch_size, "x", cfg.patch_size,
                          " patches and ", cfg.latent_channels,
                          " latent channels (TAELTX?) is not supported");
  return cfg;
}

namespace {

struct SpaceName {
  std::string space, variant;
};

// The latent space: TAEHV latents are the video model's normalised latents.
SpaceName taehv_space(const std::string& path, const TaehvConfig& cfg) {
  const std::string f = lower_file_name(path);
  const int64_t c = cfg.latent_channels;
  if (contains(f, "taew2_2") || (c == 48 && cfg.patch_size == 2)) return {"wan2.2", "taew2.2"};
  if (contains(f, "taehv1_5") || (c == 32 && cfg.patch_size == 2))
    return {"hunyuan-video-1.5", "taehv1.5"};
  if (c == 16 && cfg.patch_size == 1) {
    if (contains(f, "taehv")) return {"hunyuan-video", "taehv"};
    if (contains(f, "taeos")) return {"open-sora-1.3", "taeos1.3"};
    // The Wan 2.1 VAE's latent space, which Qwen-Image shares (taehv's README: taew2_1 for both).
    return {"qwen-image", "taew2.1"};
  }
  return {str_cat("taehv-", c, "ch"), str_cat("taehv (", c, " channels)")};
}

std::string arr_str(const int* v, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + str_cat(v[i]);
  return "(" + s + ")";
}

}  // namespace

Result<std::unique_ptr<VaeModel>> load_taehv(const ModelSource& source, const Config* config,
                                             const WeightStore& weights,
                                             std::shared_ptr<Backend> backend,
                                             const VaeLoadOptions& options) {
  (void)config;  // no config.json exists for these files; everything is read from the weights
  if (!backend) return Status::error("load_taehv: no backend");
  LATENT_ASSIGN_OR_RETURN(TaehvConfig cfg, infer_taehv_config(weights));
  const bool want_enc = options.encoder && cfg.has_encoder;
  const bool want_dec = options.decoder && cfg.has_decoder;
  if (!want_enc && !want_dec)
    return Status::errorf(weights.path(), " holds no TAEHV ",
                          options.encoder ? "encoder" : "decoder");

  // The backend's image layout: what upload() makes of a 4-D tensor.
  LATENT_ASSIGN_OR_RETURN(Tensor probe, backend->upload(Tensor::zeros({1, 2, 2, 2}, DType::kF32)));
  auto model = std::make_unique<TaehvModel>(backend, cfg, probe.layout());

  WeightBinder binder(weights, *backend);
  if (!want_enc) binder.ignore_prefix("encoder.");
  if (!want_dec) binder.ignore_prefix("decoder.");
  Status upload_status;
  ModelInfo info;
  info.architecture = "TAEHV";
  info.source = source;
  if (want_enc) {
    const int64_t before = binder.parameters_taken();
    model->encoder_ = load_encoder(binder, *backend, cfg, &upload_status);
    info.parts.push_back({"encoder", binder.parameters_taken() - before});
  }
  if (want_dec) {
    const int64_t before = binder.parameters_taken();
    model->decoder_ = load_decoder(binder, *backend, cfg, &upload_status);
    info.parts.push_back({"decoder", binder.parameters_taken() - before});
  }
  LATENT_TRY(binder.finish());
  LATENT_TRY(upload_status.with_context(str_cat("uploading ", weights.path())));
  info.storage_dtypes = binder.storage_dtypes();

  const SpaceName sn = taehv_space(weights.path(), cfg);
  info.variant = sn.variant;
  info.latent_space = LatentSpace::from_scalars(sn.space, static_cast<int>(cfg.latent_channels),
                                                cfg.downsample(), 1.0, 0.0);
  info.description =
      str_cat("layout: taehv.py single file\n", "latent_channels: ", cfg.latent_channels, "\n",
              "patch_size: ", cfg.patch_size, "\n", "encoder_width: ", cfg.encoder_width, "\n",
              "decoder_widths: [", cfg.decoder_widths[0], ", ", cfg.decoder_widths[1], ", ",
              cfg.decoder_widths[2], ", ", cfg.decoder_widths[3], "]\n",
              "encoder_time_pool: ", arr_str(cfg.encoder_pool.data(), 3), "\n",
              "decoder_time_grow: ", arr_str(cfg.decoder_grow.data(), 3), "\n",
              "temporal_factor: ", cfg.temporal_factor(),
              " (latent frame k: frames 4k .. 4k+3; the "
              "decoder drops the clip's first ",
              cfg.temporal_upscale() - 1, " frames)\n", "downsample: ", cfg.downsample(), "\n",
              "latent_space: ", sn.space, " (taehv latents are the normalised ones)");
  model->info_ = std::move(info);
  LATENT_INFO("loaded TAEHV from ", source.given.empty() ? weights.path() : source.given, " (",
              model->info_.variant, ")");
  return std::unique_ptr<VaeModel>(std::move(model));
}

}  // namespace latent
