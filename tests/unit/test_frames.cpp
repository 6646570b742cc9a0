// The frames API on the CPU backend (engine/backends/frames.h): packed frames match
// engine/core/pixels, NV12/I420 convert with the documented matrix and chroma siting, the way
// back restores frames, bad descriptions are refused, and no device transfer is counted.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/backends/frames.h"
#include "engine/backends/registry.h"

namespace latent {
namespace {

std::shared_ptr<Backend> cpu() {
  BackendOptions o;
  o.device = "cpu";
  auto b = get_backend(o);
  EXPECT_TRUE(b.ok()) << b.status().message();
  return *b;
}

FrameGeometry plan(int w, int h, int f, SizePolicy p) {
  auto g = plan_frame_geometry(w, h, f, p);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return *g;
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

FrameDesc packed(PixelFormat f, int w, int h, std::vector<uint8_t>& bytes, size_t stride) {
  FrameDesc d;
  d.format = frame_format(f);
  d.width = w;
  d.height = h;
  d.planes[0] = bytes.data();
  d.strides[0] = stride;
  return d;
}

// A YUV frame held in one vector: I420 (Y, U, V) or NV12 (Y, UV).
struct Yuv {
  int w, h;
  std::vector<uint8_t> y, u, v, uv;
  Yuv(int w_, int h_, uint64_t seed) : w(w_), h(h_) {
    const int cw = (w + 1) / 2, ch = (h + 1) / 2;
    y = random_bytes(static_cast<size_t>(w) * h, seed);
    u = random_bytes(static_cast<size_t>(cw) * ch, seed + 1);
    v = random_bytes(static_cast<size_t>(cw) * ch, seed + 2);
    uv.resize(static_cast<size_t>(cw) * ch * 2);
    for (size_t i = 0; i < u.size(); ++i) uv[2 * i] = u[i], uv[2 * i + 1] = v[i];
  }
  FrameDesc i420() {
    FrameDesc d;
    d.format = FrameFormat::kI420;
    d.width = w, d.height = h;
    d.planes[0] = y.data(), d.strides[0] = w;
    d.planes[1] = u.data(), d.strides[1] = (w + 1) / 2;
    d.planes[2] = v.data(), d.strides[2] = (w + 1) / 2;
    return d;
  }
  FrameDesc nv12() {
    FrameDesc d;
    d.format = FrameFormat::kNV12;
    d.width = w, d.height = h;
    d.planes[0] = y.data(), d.strides[0] = w;
    d.planes[1] = uv.data(), d.strides[1] = 2 * ((w + 1) / 2);
    return d;
  }
};

TEST(Frames, PackedMatchesCorePixelsForEveryPolicy) {
  auto b = cpu();
  reset_transfer_counts();
  for (SizePolicy p : {SizePolicy::kPad, SizePolicy::kCrop, SizePolicy::kScale}) {
    for (PixelFormat f : {PixelFormat::kRGB, PixelFormat::kBGRx, PixelFormat::kABGR}) {
      const int w = 37, h = 21;
      const size_t stride = w * pixel_layout(f).bytes_per_pixel + 5;
      auto bytes = random_bytes(stride * h, 7);
      const FrameGeometry g = plan(w, h, 8, p);
      auto t = frame_to_tensor(*b, packed(f, w, h, bytes, stride), g);
      ASSERT_TRUE(t.ok()) << t.status().message();
      auto host = b->download(*t);
      ASSERT_TRUE(host.ok());
      auto ref = frame_to_tensor(bytes.data(), stride, f, g);
      ASSERT_TRUE(ref.ok());
      ASSERT_EQ(host->shape(), ref->shape());
      EXPECT_EQ(host->to_floats(), ref->to_floats())
          << size_policy_name(p) << " " << pixel_format_name(f);
    }
  }
  const TransferCounts c = transfer_counts();
  EXPECT_EQ(c.host_to_device, 0);
  EXPECT_EQ(c.device_to_host, 0);
}

TEST(Frames, RoundTripRestoresThePaddedFrame) {
  auto b = cpu();
  const int w = 30, h = 18;
  const size_t stride = w * 4 + 8;
  auto bytes = random_bytes(stride * h, 11);
  for (size_t y = 0; y < static_cast<size_t>(h); ++y)
    for (int x = 0; x < w; ++x) bytes[y * stride + x * 4 + 3] = 255;  // alpha comes back as 255
  const FrameGeometry g = plan(w, h, 8, SizePolicy::kPad);
  auto t = frame_to_tensor(*b, packed(PixelFormat::kRGBA, w, h, bytes, stride), g);
  ASSERT_TRUE(t.ok()) << t.status().message();
  std::vector<uint8_t> out(stride * h, 0xAB);
  ASSERT_TRUE(tensor_to_frame(*b, *t, g, packed(PixelFormat::kRGBA, w, h, out, stride)).ok());
  for (size_t y = 0; y < static_cast<size_t>(h); ++y) {
    for (size_t x = 0; x < static_cast<size_t>(w) * 4; ++x)
      ASSERT_EQ(out[y * stride + x], bytes[y * stride + x]) << "row " << y << " byte " << x;
    for (size_t x = w * 4; x < stride; ++x) ASSERT_EQ(out[y * stride + x], 0xAB);  // untouched
  }
}

TEST(Frames, YuvKnownColours) {
  // BT.601 limited range: black, white, and the classic 75 % colour bars' red.
  struct Case {
    uint8_t y, u, v;
    int r, g, b;
  } cases[] = {{16, 128, 128, 0, 0, 0}, {235, 128, 128, 255, 255, 255}, {81, 90, 240, 255, 0, 0}};
  for (const Case& c : cases) {
    std::vector<uint8_t> y(4, c.y), u(1, c.u), v(1, c.v);
    FrameDesc d;
    d.format = FrameFormat::kI420;
    d.width = 2, d.height = 2;
    d.planes[0] = y.data(), d.strides[0] = 2;
    d.planes[1] = u.data(), d.strides[1] = 1;
    d.planes[2] = v.data(), d.strides[2] = 1;
    uint8_t rgb[12];
    ASSERT_TRUE(yuv_to_rgb_host(d, rgb, 6).ok());
    for (int p = 0; p < 4; ++p) {
      EXPECT_NEAR(rgb[3 * p + 0], c.r, 2) << int(c.y) << "," << int(c.u) << "," << int(c.v);
      EXPECT_NEAR(rgb[3 * p + 1], c.g, 2);
      EXPECT_NEAR(rgb[3 * p + 2], c.b, 2);
    }
  }
  // Full range: Y passes through for grey.
  std::vector<uint8_t> y(4, 77), u(1, 128), v(1, 128);
  FrameDesc d;
  d.format = FrameFormat::kI420;
  d.width = 2, d.height = 2;
  d.planes[0] = y.data(), d.strides[0] = 2;
  d.planes[1] = u.data(), d.strides[1] = 1;
  d.planes[2] = v.data(), d.strides[2] = 1;
  d.color.full_range = true;
  uint8_t rgb[12];
  ASSERT_TRUE(yuv_to_rgb_host(d, rgb, 6).ok());
  for (uint8_t x : rgb) EXPECT_EQ(x, 77);
}

TEST(Frames, Nv12AndI420AgreeAndShareChromaPerBlock) {
  auto b = cpu();
  Yuv f(27, 15, 3);  // odd sides: the last chroma sample covers one column/row
  std::vector<uint8_t> a(27 * 15 * 3), c(27 * 15 * 3);
  ASSERT_TRUE(yuv_to_rgb_host(f.i420(), a.data(), 27 * 3).ok());
  ASSERT_TRUE(yuv_to_rgb_host(f.nv12(), c.data(), 27 * 3).ok());
  EXPECT_EQ(a, c);
  // Equal luma in a 2x2 block gives equal RGB (one chroma sample a block).
  f.y[0] = f.y[1] = f.y[27] = f.y[28] = 120;
  ASSERT_TRUE(yuv_to_rgb_host(f.i420(), a.data(), 27 * 3).ok());
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(a[k], a[3 + k]);
    EXPECT_EQ(a[k], a[27 * 3 + k]);
    EXPECT_EQ(a[k], a[27 * 3 + 3 + k]);
  }
  // frame_to_tensor on YUV = the packed path on the converted RGB.
  const FrameGeometry g = plan(27, 15, 8, SizePolicy::kScale);
  for (FrameDesc d : {f.i420(), f.nv12()}) {
    auto t = frame_to_tensor(*b, d, g);
    ASSERT_TRUE(t.ok()) << t.status().message();
    auto ref = frame_to_tensor(a.data(), 27 * 3, PixelFormat::kRGB, g);
    ASSERT_TRUE(ref.ok());
    auto host = b->download(*t);
    ASSERT_TRUE(host.ok());
    EXPECT_EQ(host->to_floats(), ref->to_floats()) << frame_format_name(d.format);
  }
}

TEST(Frames, BadDescriptionsAreRefused) {
  auto b = cpu();
  std::vector<uint8_t> bytes(64 * 64 * 4);
  const FrameGeometry g = plan(16, 16, 8, SizePolicy::kPad);
  FrameDesc d = packed(PixelFormat::kRGBA, 16, 16, bytes, 16 * 4);
  EXPECT_TRUE(frame_to_tensor(*b, d, g).ok());

  FrameDesc small = d;
  small.strides[0] = 16 * 4 - 1;
  auto r = frame_to_tensor(*b, small, g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stride"), std::string::npos) << r.status().message();

  FrameDesc wrong_size = d;
  wrong_size.width = 17;
  r = frame_to_tensor(*b, wrong_size, g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("17x16"), std::string::npos) << r.status().message();

  FrameDesc no_plane = d;
  no_plane.format = FrameFormat::kNV12;
  no_plane.strides[0] = 16;
  r = frame_to_tensor(*b, no_plane, g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("plane 1"), std::string::npos) << r.status().message();

  FrameDesc on_gpu = d;
  on_gpu.device = Device{DeviceKind::kCUDA, 0};
  EXPECT_FALSE(frame_to_tensor(*b, on_gpu, g).ok());

  // A tensor to write the image into must be shaped and typed as the image: else refused, named.
  Tensor misfit = Tensor::zeros({1, 3, 8, 16}, b->compute_dtype());
  r = frame_to_tensor(*b, d, g, &misfit);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("into"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("[1, 3, 8, 16]"), std::string::npos) << r.status().message();

  auto t = frame_to_tensor(*b, d, g);
  ASSERT_TRUE(t.ok());
  Yuv yuv(16, 16, 1);
  auto st = tensor_to_frame(*b, *t, g, yuv.nv12());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("NV12"), std::string::npos) << st.message();
  const FrameGeometry other = plan(24, 16, 8, SizePolicy::kPad);
  FrameDesc wide = packed(PixelFormat::kRGBA, 24, 16, bytes, 24 * 4);
  st = tensor_to_frame(*b, *t, other, wide);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("shape"), std::string::npos) << st.message();
}

// The CPU needs no staging either way, and the planning examples have frame_to_tensor()'s and a
// latent's shapes; bad depths and sizes are errors, not crashes.
TEST(Frames, StagersAreNullOnTheCpuAndExamplesHaveTheRightShape) {
  auto b = cpu();
  auto up = create_frame_stager(*b, 2);
  ASSERT_TRUE(up.ok()) << up.status().message();
  EXPECT_EQ(*up, nullptr);
  auto down = create_frame_downloader(*b, 2);
  ASSERT_TRUE(down.ok()) << down.status().message();
  EXPECT_EQ(*down, nullptr);
  EXPECT_FALSE(create_frame_downloader(*b, -1).ok());
  EXPECT_FALSE(create_frame_downloader(*b, 65).ok());

  const FrameGeometry g = plan(100, 70, 8, SizePolicy::kPad);
  auto image = zero_image_tensor(*b, g);
  ASSERT_TRUE(image.ok()) << image.status().message();
  EXPECT_EQ(image->shape(), (Shape{1, 3, g.model_height(), g.model_width()}));
  std::vector<uint8_t> bytes(100 * 70 * 3);
  auto real = frame_to_tensor(*b, packed(PixelFormat::kRGB, 100, 70, bytes, 300), g);
  ASSERT_TRUE(real.ok());
  EXPECT_EQ(image->dtype(), real->dtype());
  EXPECT_EQ(image->layout(), real->layout());
  for (float v : b->download(*image)->to_floats()) ASSERT_EQ(v, 0.f);
  auto latent = zero_latent_tensor(*b, 4, 9, 13);
  ASSERT_TRUE(latent.ok()) << latent.status().message();
  EXPECT_EQ(latent->shape(), (Shape{1, 4, 9, 13}));
  EXPECT_FALSE(zero_latent_tensor(*b, 0, 9, 13).ok());
}

}  // namespace
}  // namespace latent
