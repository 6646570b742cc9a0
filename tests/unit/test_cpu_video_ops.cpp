// The CPU backend's video ops (the references of the CUDA ones in tests/gpu/test_cuda_video_vae):
// clip_to_frames / frames_to_clip move values unchanged, concat joins frames along dim 0, and
// conv3d_frames equals a plain 3-D convolution valid in time, with bias, residual and SiLU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "tests/util/test_util.h"

namespace latent {
namespace {

std::shared_ptr<Backend> cpu() {
  auto b = create_cpu_backend(DType::kF32);
  EXPECT_TRUE(b.ok()) << b.status().message();
  return b.ok() ? *b : nullptr;
}

TEST(CpuVideoOps, ClipToFramesAndBack) {
  auto b = cpu();
  const Tensor clip = test::random_tensor({1, 3, 4, 5, 6}, 1);  // [1, C, T, H, W]
  auto frames = b->clip_to_frames(clip);
  ASSERT_TRUE(frames.ok()) << frames.status().message();
  ASSERT_EQ(shape_str(frames->shape()), "[4, 3, 5, 6]");
  const float* c = clip.data_as<float>();
  const float* f = frames->data_as<float>();
  for (int t = 0; t < 4; ++t)
    for (int ch = 0; ch < 3; ++ch)
      for (int i = 0; i < 30; ++i)
        ASSERT_EQ(f[(t * 3 + ch) * 30 + i], c[(ch * 4 + t) * 30 + i]) << t << " " << ch << " " << i;
  auto back = b->frames_to_clip(*frames);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(shape_str(back->shape()), "[1, 3, 4, 5, 6]");
  EXPECT_EQ(relative_l2(*back, clip), 0.0);
  // two clips are not one clip
  EXPECT_FALSE(b->clip_to_frames(test::random_tensor({2, 3, 4, 5, 6}, 2)).ok());
  // frames join along dim 0
  auto two = b->concat({*frames, *frames}, 0);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(shape_str(two->shape()), "[8, 3, 5, 6]");
}

TEST(CpuVideoOps, Conv3dFramesIsA3dConvolution) {
  auto b = cpu();
  const int T = 3, kt = 3, C = 4, K = 5, H = 6, W = 7, k = 3;
  const Tensor x = test::random_tensor({T + kt - 1, C, H, W}, 3);
  const Tensor w = test::random_tensor({K, C, kt * k, k}, 4, -0.3f, 0.3f);  // [K, C, kt, k, k]
  const Tensor bias = test::random_tensor({K}, 5);
  const Tensor res = test::random_tensor({T, K, H, W}, 6);
  auto y = b->conv3d_frames(x, w, kt, bias, Conv2dParams::same(k), res, Activation::kSiLU);
  ASSERT_TRUE(y.ok()) << y.status().message();
  ASSERT_EQ(shape_str(y->shape()), "[3, 5, 6, 7]");
  const float* xv = x.data_as<float>();
  const float* wv = w.data_as<float>();
  for (int t = 0; t < T; ++t)
    for (int o = 0; o < K; ++o)
      for (int i = 0; i < H; ++i)
        for (int j = 0; j < W; ++j) {
          double s = bias.data_as<float>()[o] + res.data_as<float>()[((t * K + o) * H + i) * W + j];
          for (int dt = 0; dt < kt; ++dt)
            for (int c = 0; c < C; ++c)
              for (int di = 0; di < k; ++di)
                for (int dj = 0; dj < k; ++dj) {
                  const int yi = i + di - 1, xj = j + dj - 1;
                  if (yi < 0 || yi >= H || xj < 0 || xj >= W) continue;
                  s += static_cast<double>(wv[(((o * C + c) * kt + dt) * k + di) * k + dj]) *
                       xv[(((t + dt) * C + c) * H + yi) * W + xj];
                }
          const double want = s / (1 + std::exp(-s));
          ASSERT_NEAR(y->data_as<float>()[((t * K + o) * H + i) * W + j], want, 1e-4)
              << t << " " << o << " " << i << " " << j;
        }
  // Too few frames for the taps, or a kernel height that is not kt * kh: errors, not crashes.
  EXPECT_FALSE(b->conv3d_frames(test::random_tensor({2, C, H, W}, 7), w, kt, bias,
                                Conv2dParams::same(k), Tensor(), Activation::kNone)
                   .ok());
  EXPECT_FALSE(b->conv3d_frames(x, test::random_tensor({K, C, 8, k}, 8), kt, bias,
                                Conv2dParams::same(k), Tensor(), Activation::kNone)
                   .ok());
}

// conv3d_frames_after: the past frames in one tensor or in two (a causal cache that keeps its
// frames as they came), then the chunk, give what conv3d_frames gives on the joined frames.
TEST(CpuVideoOps, Conv3dFramesAfterPastTensors) {
  auto b = cpu();
  const int T = 2, kt = 3, C = 4, K = 5, H = 6, W = 7, k = 3;
  const Tensor x = test::random_tensor({T + kt - 1, C, H, W}, 13);
  const Tensor w = test::random_tensor({K, C, kt * k, k}, 14, -0.3f, 0.3f);
  const Tensor bias = test::random_tensor({K}, 15);
  auto frames = [&](int64_t first, int64_t count) {
    Tensor t = Tensor::empty({count, C, H, W}, DType::kF32);
    const int64_t plane = C * H * W;
    std::copy(x.data_as<float>() + first * plane, x.data_as<float>() + (first + count) * plane,
              t.data_as<float>());
    return t;
  };
  auto want = b->conv3d_frames(x, w, kt, bias, Conv2dParams::same(k), Tensor(), Activation::kSiLU);
  ASSERT_TRUE(want.ok()) << want.status().message();
  auto one = b->conv3d_frames_after({frames(0, 2)}, frames(2, T), w, kt, bias,
                                    Conv2dParams::same(k), Tensor(), Activation::kSiLU);
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(relative_l2(*one, *want), 0.0);
  auto two = b->conv3d_frames_after({frames(0, 1), frames(1, 1)}, frames(2, T), w, kt, bias,
                                    Conv2dParams::same(k), Tensor(), Activation::kSiLU);
  ASSERT_TRUE(two.ok()) << two.status().message();
  EXPECT_EQ(relative_l2(*two, *want), 0.0);
  // Past frames of another size: an error naming the tensors, not a crash.
  auto bad = b->conv3d_frames_after({test::random_tensor({2, C, H + 1, W}, 16)}, frames(2, T), w,
                                    kt, bias, Conv2dParams::same(k), Tensor(), Activation::kNone);
  EXPECT_FALSE(bad.ok());
}

}  // namespace
}  // namespace latent
