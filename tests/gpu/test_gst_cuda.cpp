// The GPU frame path: engine/backends/frames.h on the CUDA backend against the CPU backend
// (packed, NV12 and I420 input under every size policy, host, page-locked host and device frames,
// the way back, transfer counts), and vaeencode ! vaedecode with device=cuda against device=cpu
// (RGB, NV12, I420 input; LATENCY answers; the page-locked frames vaeencode offers upstream);
// latents and frames in CUDA memory between the elements and GStreamer's CUDA elements (cudaupload,
// cudadownload), with the engine's host<->device copies counted; with two or more GPUs, one
// pipeline with a branch per device (each element on its own device's context). Exits 77 (skipped)
// without a GPU.
#include <gst/gst.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/backends/frames.h"
#include "engine/backends/registry.h"
#include "tests/util/gst_cuda_test_util.h"
#include "tests/util/test_util.h"

#ifdef LATENT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef LATENT_HAVE_GST_CUDA
#ifndef GST_USE_UNSTABLE_API
#define GST_USE_UNSTABLE_API
#endif
#include <gst/cuda/gstcudacontext.h>
#include <gst/cuda/gstcudamemory.h>
#endif

namespace latent {
namespace {

using test::dit_root;
using test::mean_abs_diff;
using test::PipelineRun;
using test::run_pipeline;
using test::same_frame_sizes;

// Sets an environment variable for a scope (the elements read their switches when asked).
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { g_setenv(n, value, TRUE); }
  ~ScopedEnv() { g_unsetenv(name); }
};

std::shared_ptr<Backend> backend(const char* device) {
  BackendOptions o;
  o.device = device;
  auto b = get_backend(o);
  EXPECT_TRUE(b.ok()) << b.status().message();
  return b.ok() ? *b : nullptr;
}

// `converted` (a stager's tensor) holds `frame` converted: the values frame_to_tensor() makes.
void expect_conversion_of(Backend& cuda, const Tensor& converted, const FrameDesc& frame,
                          const FrameGeometry& g, const std::string& what) {
  auto direct = frame_to_tensor(cuda, frame, g);
  ASSERT_TRUE(direct.ok()) << direct.status().message();
  auto a = cuda.download(converted), b = cuda.download(*direct);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->to_floats(), b->to_floats()) << what;
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

// A host frame of any format with random bytes (strides padded by 12 bytes).
struct HostFrame {
  FrameDesc desc;
  std::vector<uint8_t> planes[3];
  HostFrame(FrameFormat f, int w, int h, uint64_t seed) {
    desc.format = f;
    desc.width = w;
    desc.height = h;
    const int n = frame_format_planes(f);
    for (int i = 0; i < n; ++i) {
      size_t row, rows = i == 0 ? h : (h + 1) / 2;
      if (frame_format_is_packed(f))
        row = static_cast<size_t>(w) * pixel_layout(frame_pixel_format(f)).bytes_per_pixel;
      else
        row = i == 0 ? w : static_cast<size_t>((w + 1) / 2) * (f == FrameFormat::kNV12 ? 2 : 1);
      desc.strides[i] = row + 12;
      planes[i] = random_bytes(desc.strides[i] * rows, seed + i);
      desc.planes[i] = planes[i].data();
    }
  }
};

// `n` host frames, seeds `seed`, `seed` + 1, ...
std::vector<HostFrame> host_frames(int n, FrameFormat f, int w, int h, uint64_t seed) {
  std::vector<HostFrame> frames;
  for (int i = 0; i < n; ++i) frames.emplace_back(f, w, h, seed + i);
  return frames;
}

// What a create_frame_stager() or create_frame_downloader() call made; null (and a test failure)
// if it failed.
template <typename T>
std::unique_ptr<T> made(Result<std::unique_ptr<T>> r) {
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(*r) : nullptr;
}

FrameGeometry plan(int w, int h, SizePolicy p) {
  auto g = plan_frame_geometry(w, h, 8, p);
  EXPECT_TRUE(g.ok());
  return *g;
}

TEST(CudaFrames, FrameToTensorMatchesTheCpuWithinBf16) {
  auto cuda = backend("cuda"), cpu = backend("cpu");
  ASSERT_TRUE(cuda && cpu);
  for (FrameFormat f : {FrameFormat::kRGB, FrameFormat::kBGRx, FrameFormat::kARGB,
                        FrameFormat::kNV12, FrameFormat::kI420}) {
    for (SizePolicy p : {SizePolicy::kPad, SizePolicy::kCrop, SizePolicy::kScale}) {
      SCOPED_TRACE(std::string(frame_format_name(f)) + " " + size_policy_name(p));
      HostFrame frame(f, 101, 67, 3);
      const FrameGeometry g = plan(101, 67, p);
      reset_transfer_counts();
      auto on_gpu = frame_to_tensor(*cuda, frame.desc, g);
      ASSERT_TRUE(on_gpu.ok()) << on_gpu.status().message();
      const TransferCounts c = transfer_counts();
      EXPECT_EQ(c.host_to_device, frame_format_planes(f));  // the raw planes, nothing else
      EXPECT_EQ(c.device_to_host, 0);
      auto ref = frame_to_tensor(*cpu, frame.desc, g);
      ASSERT_TRUE(ref.ok());
      auto got = cuda->download(*on_gpu);
      ASSERT_TRUE(got.ok());
      ASSERT_EQ(got->shape(), ref->shape());
      const std::vector<float> a = got->to_floats(), b = ref->to_floats();
      float worst = 0;
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
      EXPECT_LE(worst, 1.f / 128) << "bf16 keeps 8 bits: |x| <= 1 rounds by at most 2^-9";
    }
  }
}

#ifdef LATENT_HAVE_CUDA
TEST(CudaFrames, DeviceFramesAreReadInPlace) {
  auto cuda = backend("cuda"), cpu = backend("cpu");
  ASSERT_TRUE(cuda && cpu);
  HostFrame frame(FrameFormat::kRGBA, 64, 48, 5);
  const size_t bytes = frame.desc.strides[0] * 48;
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, frame.planes[0].data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  FrameDesc d = frame.desc;
  d.planes[0] = dev;
  d.device = cuda->device();
  const FrameGeometry g = plan(64, 48, SizePolicy::kPad);
  reset_transfer_counts();
  auto t = frame_to_tensor(*cuda, d, g);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(transfer_counts().host_to_device, 0);
  // The way back into device memory, then compare on the host.
  void* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, bytes), cudaSuccess);
  FrameDesc o = d;
  o.planes[0] = out;
  ASSERT_TRUE(tensor_to_frame(*cuda, *t, g, o).ok());
  EXPECT_EQ(transfer_counts().device_to_host, 0);
  std::vector<uint8_t> back(bytes);
  ASSERT_EQ(cudaMemcpy(back.data(), out, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t y = 0; y < 48; ++y)
    for (size_t x = 0; x < 64 * 4; ++x) {
      const int want = x % 4 == 3 ? 255 : frame.planes[0][y * frame.desc.strides[0] + x];
      ASSERT_LE(std::abs(int(back[y * frame.desc.strides[0] + x]) - want), 1) << y << "," << x;
    }
  cudaFree(dev);
  cudaFree(out);
}
#endif  // LATENT_HAVE_CUDA

TEST(CudaFrames, TensorToFrameMatchesTheCpu) {
  auto cuda = backend("cuda"), cpu = backend("cpu");
  ASSERT_TRUE(cuda && cpu);
  for (SizePolicy p : {SizePolicy::kPad, SizePolicy::kCrop, SizePolicy::kScale}) {
    SCOPED_TRACE(size_policy_name(p));
    const FrameGeometry g = plan(90, 50, p);
    // bf16-exact values, so both backends decode the same numbers.
    Tensor img = test::random_tensor({1, 3, g.model_height(), g.model_width()}, 9, -1.1f, 1.1f)
                     .to_dtype(DType::kBF16)
                     .to_dtype(DType::kF32);
    auto on_gpu = cuda->upload(img);
    auto on_cpu = cpu->upload(img);
    ASSERT_TRUE(on_gpu.ok() && on_cpu.ok());
    HostFrame a(FrameFormat::kBGRA, 90, 50, 1), b(FrameFormat::kBGRA, 90, 50, 1);
    reset_transfer_counts();
    ASSERT_TRUE(tensor_to_frame(*cuda, *on_gpu, g, a.desc).ok());
    EXPECT_EQ(transfer_counts().device_to_host, 1);  // only the frame's bytes
    ASSERT_TRUE(tensor_to_frame(*cpu, *on_cpu, g, b.desc).ok());
    int worst = 0;
    for (size_t i = 0; i < a.planes[0].size(); ++i)
      worst = std::max(worst, std::abs(int(a.planes[0][i]) - int(b.planes[0][i])));
    EXPECT_LE(worst, 1);  // rounding of bilinear sums only
  }
}

// Staged frames convert to what frame_to_tensor() makes, in order, with one upload each.
TEST(CudaFrames, StagedFramesMatchDirectConversion) {
  auto cuda = backend("cuda");
  ASSERT_TRUE(cuda);
  std::unique_ptr<FrameStager> stager = made(create_frame_stager(*cuda, 2));
  ASSERT_TRUE(stager);
  const FrameGeometry g = plan(80, 56, SizePolicy::kPad);
  const std::vector<HostFrame> frames = host_frames(8, FrameFormat::kNV12, 80, 56, 100);
  std::deque<uint64_t> tickets;
  int converted = 0;
  for (int i = 0; i < 8; ++i) {
    reset_transfer_counts();
    auto t = stager->stage(frames[i].desc);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(transfer_counts().host_to_device, 1);  // the frame's planes in one copy
    tickets.push_back(*t);
    if (tickets.size() <= 2) continue;  // two frames ahead
    auto staged = stager->convert(tickets.front(), g);
    tickets.pop_front();
    ASSERT_TRUE(staged.ok()) << staged.status().message();
    expect_conversion_of(*cuda, *staged, frames[converted].desc, g, str_cat("frame ", converted));
    ++converted;
  }
  EXPECT_EQ(converted, 6);
  // A fourth frame in flight with depth 2 is refused, not overwritten.
  ASSERT_TRUE(stager->stage(frames[0].desc).ok());
  EXPECT_FALSE(stager->stage(frames[1].desc).ok());
}

// A frame converted into a given image tensor (a plan's input buffer): written there, in place,
// with the bytes of a fresh conversion, directly and through the stager; a tensor of another
// shape, dtype or layout is refused, naming it.
TEST(CudaFrames, FramesConvertIntoAGivenImageTensor) {
  auto cuda = backend("cuda");
  ASSERT_TRUE(cuda);
  const FrameGeometry g = plan(80, 56, SizePolicy::kPad);
  const std::vector<HostFrame> frames = host_frames(2, FrameFormat::kNV12, 80, 56, 300);
  auto fresh = frame_to_tensor(*cuda, frames[0].desc, g);
  ASSERT_TRUE(fresh.ok()) << fresh.status().message();
  auto target = zero_image_tensor(*cuda, g);
  ASSERT_TRUE(target.ok());
  auto into = frame_to_tensor(*cuda, frames[0].desc, g, &*target);
  ASSERT_TRUE(into.ok()) << into.status().message();
  EXPECT_EQ(into->data(), target->data()) << "written into the given tensor";
  auto a = cuda->download(*fresh), b = cuda->download(*target);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->to_floats(), b->to_floats());
  std::unique_ptr<FrameStager> stager = made(create_frame_stager(*cuda, 2));
  ASSERT_TRUE(stager);
  auto ticket = stager->stage(frames[1].desc);
  ASSERT_TRUE(ticket.ok());
  auto staged = stager->convert(*ticket, g, &*target);
  ASSERT_TRUE(staged.ok()) << staged.status().message();
  EXPECT_EQ(staged->data(), target->data());
  auto want = frame_to_tensor(*cuda, frames[1].desc, g);
  ASSERT_TRUE(want.ok());
  a = cuda->download(*want), b = cuda->download(*target);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->to_floats(), b->to_floats());
  auto wrong = cuda->zeros({1, 3, 56, 64});
  ASSERT_TRUE(wrong.ok());
  auto refused = frame_to_tensor(*cuda, frames[0].desc, g, &*wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("into"), std::string::npos)
      << refused.status().message();
}

#ifdef LATENT_HAVE_CUDA
// Frames in device memory (pitched NV12 planes, as a decoder's pool holds them) are copied out
// by stage(): their buffers may be overwritten as soon as it returns, and the conversion still
// equals frame_to_tensor() of the original frame. Nothing crosses to or from the host.
TEST(CudaFrames, StagedDeviceFramesMayBeReusedAtOnce) {
  auto cuda = backend("cuda");
  ASSERT_TRUE(cuda);
  std::unique_ptr<FrameStager> stager = made(create_frame_stager(*cuda, 4));
  ASSERT_TRUE(stager);
  const FrameGeometry g = plan(80, 56, SizePolicy::kPad);
  const std::vector<HostFrame> frames = host_frames(8, FrameFormat::kNV12, 80, 56, 200);
  // One device buffer for every frame, as a pool of one surface would hand it out again.
  size_t bytes[3] = {};
  for (int i = 0; i < 2; ++i) bytes[i] = frames[0].planes[i].size();
  void* planes[2] = {};
  for (int i = 0; i < 2; ++i) ASSERT_EQ(cudaMalloc(&planes[i], bytes[i]), cudaSuccess);
  std::deque<std::pair<uint64_t, int>> tickets;
  int converted = 0;
  auto convert_front = [&] {
    auto staged = stager->convert(tickets.front().first, g);
    ASSERT_TRUE(staged.ok()) << staged.status().message();
    expect_conversion_of(*cuda, *staged, frames[tickets.front().second].desc, g,
                         str_cat("frame ", tickets.front().second));
    tickets.pop_front();
    ++converted;
  };
  for (int i = 0; i < 8; ++i) {
    FrameDesc d = frames[i].desc;
    d.device = cuda->device();
    for (int p = 0; p < 2; ++p) {
      ASSERT_EQ(cudaMemcpy(planes[p], frames[i].planes[p].data(), bytes[p], cudaMemcpyHostToDevice),
                cudaSuccess);
      d.planes[p] = planes[p];
    }
    reset_transfer_counts();
    auto t = stager->stage(d);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(transfer_counts().host_to_device, 0);
    EXPECT_EQ(transfer_counts().device_to_host, 0);
    // The source goes back to its producer, which overwrites it.
    for (int p = 0; p < 2; ++p) ASSERT_EQ(cudaMemset(planes[p], 0x5a, bytes[p]), cudaSuccess);
    tickets.emplace_back(*t, i);
    if (tickets.size() > 3) convert_front();
  }
  while (!tickets.empty()) convert_front();
  EXPECT_EQ(converted, 8);
  for (void* p : planes) cudaFree(p);
}

// Host frames in page-locked memory (FrameDesc::pinned) are uploaded from where they are: the
// same tensors as frame_to_tensor, one host-to-device copy a frame, and the frame may be
// overwritten as soon as convert() returns (large frames, converted at once as video mode does
// and `depth` frames later as image mode does: a convert() that did not wait for the copy would
// let it read the overwritten bytes).
TEST(CudaFrames, PinnedFramesUploadInPlaceAndAreFreeOnceConverted) {
  auto cuda = backend("cuda");
  ASSERT_TRUE(cuda);
  const int w = 1920, h = 1080;
  const FrameGeometry g = plan(w, h, SizePolicy::kPad);
  for (FrameFormat f : {FrameFormat::kRGBA, FrameFormat::kNV12, FrameFormat::kI420}) {
    for (int ahead : {0, 2}) {
      SCOPED_TRACE(str_cat(frame_format_name(f), ", converted ", ahead, " frames later"));
      std::unique_ptr<FrameStager> stager = made(create_frame_stager(*cuda, 2));
      ASSERT_TRUE(stager);
      const std::vector<HostFrame> frames = host_frames(5, f, w, h, 300);
      // Each frame's planes copied into one page-locked block, as a pool's buffer holds them.
      struct Pinned {
        void* block = nullptr;
        FrameDesc desc;
      };
      std::vector<Pinned> pinned(frames.size());
      for (size_t i = 0; i < frames.size(); ++i) {
        size_t total = 0;
        for (const auto& pl : frames[i].planes) total += pl.size();
        auto block = alloc_pinned_host(0, total);
        ASSERT_TRUE(block.ok()) << block.status().message();
        pinned[i].block = *block;
        pinned[i].desc = frames[i].desc;
        pinned[i].desc.pinned = true;
        auto* at = static_cast<uint8_t*>(*block);
        for (int p = 0; p < 3 && !frames[i].planes[p].empty(); ++p) {
          std::memcpy(at, frames[i].planes[p].data(), frames[i].planes[p].size());
          pinned[i].desc.planes[p] = at;
          at += frames[i].planes[p].size();
        }
      }
      std::deque<std::pair<uint64_t, size_t>> tickets;
      auto convert_front = [&] {
        const auto [ticket, i] = tickets.front();
        tickets.pop_front();
        auto staged = stager->convert(ticket, g);
        ASSERT_TRUE(staged.ok()) << staged.status().message();
        // Free once convert() returned: the producer writes its next frame there.
        for (int p = 0; p < 3; ++p)
          if (pinned[i].desc.planes[p])
            std::memset(pinned[i].desc.planes[p], 0xa5, frames[i].planes[p].size());
        expect_conversion_of(*cuda, *staged, frames[i].desc, g, str_cat("frame ", i));
      };
      for (size_t i = 0; i < frames.size(); ++i) {
        reset_transfer_counts();
        auto t = stager->stage(pinned[i].desc);
        ASSERT_TRUE(t.ok()) << t.status().message();
        EXPECT_EQ(transfer_counts().host_to_device, 1);  // the frame's planes in one copy
        tickets.emplace_back(*t, i);
        if (tickets.size() > static_cast<size_t>(ahead)) convert_front();
      }
      while (!tickets.empty()) convert_front();
      for (Pinned& p : pinned) free_pinned_host(0, p.block);
    }
  }
}

// Work queued on `b`'s stream that keeps it busy a while (`additions` additions of a
// [1, 64, 1080, 1920] tensor, ~0.25 ms each on an H100), so that what is queued after it runs late.
void queue_busy_work(Backend& b, int additions) {
  auto big = b.zeros({1, 64, 1080, 1920});
  ASSERT_TRUE(big.ok()) << big.status().message();
  Tensor sum = *big;
  for (int i = 0; i < additions; ++i) sum = *b.add(sum, *big);
}

// The test below, for the LATENT_STAGE_ORDER in the environment.
void staged_slot_is_refilled_only_after_its_conversion_has_read() {
  auto cuda = backend("cuda");
  ASSERT_TRUE(cuda);
  const int w = 1920, h = 1080;
  const FrameGeometry g = plan(w, h, SizePolicy::kPad);
  const std::vector<HostFrame> frames = host_frames(3, FrameFormat::kRGBA, w, h, 400);
  for (bool pinned : {true, false}) {
    SCOPED_TRACE(pinned ? "page-locked frames, uploaded in place" : "pageable frames, copied");
    std::unique_ptr<FrameStager> stager = made(create_frame_stager(*cuda, 1));  // 2 slots
    ASSERT_TRUE(stager);
    std::vector<void*> blocks;
    std::vector<FrameDesc> descs;
    for (const HostFrame& f : frames) {
      FrameDesc d = f.desc;
      if (pinned) {
        auto block = alloc_pinned_host(0, f.planes[0].size());
        ASSERT_TRUE(block.ok()) << block.status().message();
        std::memcpy(*block, f.planes[0].data(), f.planes[0].size());
        blocks.push_back(*block);
        d.planes[0] = *block;
        d.pinned = true;
      }
      descs.push_back(d);
    }
    // Frame 0 staged, then converted behind busy work; frame 1 staged; frame 2 takes frame 0's
    // slot while frame 0's conversion has not run yet.
    auto t0 = stager->stage(descs[0]);
    ASSERT_TRUE(t0.ok()) << t0.status().message();
    ASSERT_TRUE(cuda->synchronize().ok());  // frame 0's upload done
    queue_busy_work(*cuda, 16);  // on the compute stream
    auto first = stager->convert(*t0, g);
    ASSERT_TRUE(first.ok()) << first.status().message();
    auto t1 = stager->stage(descs[1]);
    ASSERT_TRUE(t1.ok()) << t1.status().message();
    auto t2 = stager->stage(descs[2]);
    ASSERT_TRUE(t2.ok()) << t2.status().message();
    expect_conversion_of(*cuda, *first, frames[0].desc, g,
                         "frame 0's conversion read another frame");
    // The later frames convert to themselves.
    for (auto [ticket, i] : {std::pair{*t1, 1}, std::pair{*t2, 2}}) {
      auto staged = stager->convert(ticket, g);
      ASSERT_TRUE(staged.ok()) << staged.status().message();
      expect_conversion_of(*cuda, *staged, frames[i].desc, g, str_cat("frame ", i));
    }
    stager.reset();
    for (void* p : blocks) free_pinned_host(0, p);
  }
}

// A slot of the stager's ring is refilled (depth + 1 frames later) only after the conversion
// that read it has run, whether stage() waits for it on the host (LATENT_STAGE_ORDER=host, the
// default) or makes the copy stream wait (device): here the conversion sits behind ~ms of work
// on the compute stream when the slot's next frame is staged, so an unordered upload would land
// first and the conversion would read the newer frame.
TEST(CudaFrames, AStagedSlotIsRefilledOnlyAfterItsConversionHasRead) {
  for (const char* order : {"host", "device"}) {
    SCOPED_TRACE(str_cat("LATENT_STAGE_ORDER=", order));
    g_setenv("LATENT_STAGE_ORDER", order, TRUE);  // read when a stager is made
    staged_slot_is_refilled_only_after_its_conversion_has_read();
  }
  g_unsetenv("LATENT_STAGE_ORDER");
}

#endif  // LATENT_HAVE_CUDA

// ---- the elements ---------------------------------------------------------------------------

std::string model() { return test::fixtures_dir() + "/tiny_taesd"; }

std::string round_trip(const char* device, const char* format, const char* policy) {
  return str_cat("videotestsrc num-buffers=3 pattern=smpte ! video/x-raw,format=", format,
                 ",width=100,height=60,framerate=30/1 ! vaeencode model=", model(),
                 " device=", device, " size-policy=", policy, " ! vaedecode model=", model(),
                 " device=", device, " ! video/x-raw,format=RGB ! fakesink name=out sync=false");
}

TEST(GstCuda, EncodeDecodeOnTheGpuMatchesTheCpu) {
  for (const char* format : {"RGB", "BGRx", "NV12", "I420"}) {
    for (const char* policy : {"pad", "crop", "scale"}) {
      SCOPED_TRACE(std::string(format) + " " + policy);
      PipelineRun gpu = run_pipeline(round_trip("cuda", format, policy));
      PipelineRun cpu = run_pipeline(round_trip("cpu", format, policy));
      ASSERT_TRUE(same_frame_sizes(gpu, cpu, 3u));
      for (size_t i = 0; i < 3; ++i) {
        // bf16 activations through a whole (tiny) VAE against fp32: a few levels on average.
        EXPECT_LE(mean_abs_diff(gpu.frames[i], cpu.frames[i]), 3.0) << "frame " << i;
      }
    }
  }
}

TEST(GstCuda, PrefetchingChangesNoByte) {
  const std::string base = round_trip("cuda", "I420", "scale");
  std::string none = base;
  none.replace(none.find(" size-policy"), 0, " prefetch-depth=0");
  PipelineRun a = run_pipeline(base), b = run_pipeline(none);
  ASSERT_TRUE(a.ok) << a.error;
  ASSERT_TRUE(b.ok) << b.error;
  ASSERT_EQ(a.frames.size(), 3u);  // EOS drains the frames held back
  EXPECT_EQ(a.frames, b.frames);
}

// With prefetching on a GPU, vaeencode offers upstream page-locked buffers (its ALLOCATION
// answer): videotestsrc draws every frame into one, the stager uploads it in place, and the
// frames out are byte for byte those of a run without prefetching (whose frames stay in plain
// system memory), also with the source on its own thread (a queue: the producer refills a
// buffer as soon as vaeencode lets it go).
struct MemorySeen {
  std::mutex lock;
  std::vector<std::string> types;
};

GstPadProbeReturn note_memory(GstPad*, GstPadProbeInfo* info, gpointer data) {
  auto* seen = static_cast<MemorySeen*>(data);
  GstBuffer* b = GST_PAD_PROBE_INFO_BUFFER(info);
  GstMemory* mem = gst_buffer_n_memory(b) == 1 ? gst_buffer_peek_memory(b, 0) : nullptr;
  std::lock_guard<std::mutex> hold(seen->lock);
  seen->types.emplace_back(mem && mem->allocator && mem->allocator->mem_type
                               ? mem->allocator->mem_type
                               : "(several memories)");
  return GST_PAD_PROBE_OK;
}

// The memory of each frame that reached vaeencode (named enc) in `line`, played to EOS.
std::vector<std::string> memory_into_encoder(const std::string& line) {
  GstElement* p = gst_parse_launch(line.c_str(), nullptr);
  EXPECT_NE(p, nullptr) << line;
  if (!p) return {};
  MemorySeen seen;
  GstElement* enc = gst_bin_get_by_name(GST_BIN(p), "enc");
  GstPad* sink = gst_element_get_static_pad(enc, "sink");
  gst_pad_add_probe(sink, GST_PAD_PROBE_TYPE_BUFFER, note_memory, &seen, nullptr);
  EXPECT_EQ(test::play_to_end(p, 120 * GST_SECOND), "") << line;
  gst_object_unref(sink);
  gst_object_unref(enc);
  gst_object_unref(p);
  return seen.types;
}

TEST(GstCuda, UpstreamDrawsIntoPageLockedFramesThatUploadInPlace) {
  // On by default; LATENT_PINNED_INPUT=0 turns the offer off (read at each ALLOCATION query).
  g_setenv("LATENT_PINNED_INPUT", "0", TRUE);
  EXPECT_NE(memory_into_encoder(str_cat("videotestsrc num-buffers=2 ! video/x-raw,format=RGBA,"
                                        "width=64,height=64 ! vaeencode name=enc model=",
                                        model(), " device=cuda ! fakesink"))
                .at(0),
            "LatentPinnedHost");
  g_unsetenv("LATENT_PINNED_INPUT");
  for (const char* format : {"RGBA", "NV12", "I420"}) {
    SCOPED_TRACE(format);
    auto line = [&](const char* queue, const char* depth) {
      return str_cat("videotestsrc num-buffers=9 pattern=ball ! video/x-raw,format=", format,
                     ",width=100,height=60,framerate=30/1 ! ", queue,
                     "vaeencode name=enc model=", model(), " device=cuda ", depth,
                     " ! vaedecode model=", model(),
                     " device=cuda ! video/x-raw,format=RGB ! fakesink name=out sync=false");
    };
    const std::vector<std::string> pinned = memory_into_encoder(line("", ""));
    ASSERT_EQ(pinned.size(), 9u);
    for (size_t i = 0; i < pinned.size(); ++i)
      EXPECT_EQ(pinned[i], "LatentPinnedHost") << "frame " << i;
    const std::vector<std::string> plain = memory_into_encoder(line("", "prefetch-depth=0"));
    ASSERT_EQ(plain.size(), 9u);
    EXPECT_NE(plain[0], "LatentPinnedHost") << "no pool is offered without prefetching";

    PipelineRun in_place = run_pipeline(line("", ""));
    PipelineRun threaded = run_pipeline(line("queue max-size-buffers=2 ! ", ""));
    PipelineRun unstaged = run_pipeline(line("", "prefetch-depth=0"));
    ASSERT_TRUE(in_place.ok) << in_place.error;
    ASSERT_TRUE(threaded.ok) << threaded.error;
    ASSERT_TRUE(unstaged.ok) << unstaged.error;
    ASSERT_EQ(unstaged.frames.size(), 9u);
    EXPECT_EQ(in_place.frames, unstaged.frames);
    EXPECT_EQ(threaded.frames, unstaged.frames);
  }
}

// QoS is on by default: a frame dropped as late after its upload was staged (prefetch-depth 2)
// must free its slot of the staging ring, or the frame depth + 1 later is refused ("staged while
// earlier frames wait for conversion"). Every frame after the first is declared late; the stream
// still runs to EOS, frames are dropped, nothing fails.
struct QosInjector {
  GstPad* enc_src = nullptr;
  int seen = 0;
};

GstPadProbeReturn declare_late(GstPad*, GstPadProbeInfo* info, gpointer user_data) {
  auto* q = static_cast<QosInjector*>(user_data);
  GstBuffer* b = GST_PAD_PROBE_INFO_BUFFER(info);
  if (++q->seen >= 1 && GST_BUFFER_PTS_IS_VALID(b))
    // The sink is 10 s behind: everything before PTS + 10 s is too late.
    gst_pad_send_event(q->enc_src, gst_event_new_qos(GST_QOS_TYPE_UNDERFLOW, 0.5,
                                                     10 * GST_SECOND, GST_BUFFER_PTS(b)));
  return GST_PAD_PROBE_OK;
}

void frames_dropped_by_qos_free_their_staged_uploads();

TEST(GstCuda, FramesDroppedByQosFreeTheirStagedUploads) {
  for (const char* pinned : {"0", "1"}) {  // frames copied into the slots, and uploaded in place
    SCOPED_TRACE(str_cat("LATENT_PINNED_INPUT=", pinned));
    g_setenv("LATENT_PINNED_INPUT", pinned, TRUE);
    frames_dropped_by_qos_free_their_staged_uploads();
  }
  g_unsetenv("LATENT_PINNED_INPUT");
}

void frames_dropped_by_qos_free_their_staged_uploads() {
  const std::string line =
      "videotestsrc num-buffers=24 ! video/x-raw,format=RGB,width=256,height=256,framerate=30/1 ! "
      "vaeencode name=enc device=cuda prefetch-depth=2 ! fakesink name=out sync=false";
  GstElement* pipeline = gst_parse_launch(line.c_str(), nullptr);
  ASSERT_NE(pipeline, nullptr);
  GstElement* enc = gst_bin_get_by_name(GST_BIN(pipeline), "enc");
  GstElement* out = gst_bin_get_by_name(GST_BIN(pipeline), "out");
  QosInjector q;
  q.enc_src = gst_element_get_static_pad(enc, "src");
  GstPad* sink = gst_element_get_static_pad(out, "sink");
  gst_pad_add_probe(sink, GST_PAD_PROBE_TYPE_BUFFER, declare_late, &q, nullptr);
  gst_element_set_state(pipeline, GST_STATE_PLAYING);
  GstBus* bus = gst_element_get_bus(pipeline);
  GstMessage* m = gst_bus_timed_pop_filtered(
      bus, 120 * GST_SECOND, static_cast<GstMessageType>(GST_MESSAGE_ERROR | GST_MESSAGE_EOS));
  ASSERT_NE(m, nullptr) << "no EOS or error in 120 s";
  std::string error;
  if (GST_MESSAGE_TYPE(m) == GST_MESSAGE_ERROR) {
    GError* e = nullptr;
    gst_message_parse_error(m, &e, nullptr);
    error = e ? e->message : "error";
    g_clear_error(&e);
  }
  gst_message_unref(m);
  guint64 processed = 0, dropped = 0;
  g_object_get(enc, "frames-processed", &processed, "frames-dropped", &dropped, nullptr);
  gst_element_set_state(pipeline, GST_STATE_NULL);
  EXPECT_EQ(error, "");
  EXPECT_GT(dropped, 3u) << "the test dropped too few frames to wrap the staging ring";
  EXPECT_EQ(processed + dropped, 24u);
  gst_object_unref(bus);
  gst_object_unref(sink);
  gst_object_unref(q.enc_src);
  gst_object_unref(out);
  gst_object_unref(enc);
  gst_object_unref(pipeline);
}

TEST(GstCuda, LatencyQueryCountsBothStages) {
  PipelineRun r = run_pipeline(round_trip("cuda", "RGB", "pad"));
  ASSERT_TRUE(r.ok) << r.error;
  ASSERT_TRUE(GST_CLOCK_TIME_IS_VALID(r.latency_min));
  EXPECT_GT(r.latency_min, 0u);  // videotestsrc is not live: the stages' own figures
  EXPECT_LT(r.latency_min, 10 * GST_SECOND);
}

// ---- plans and CUDA graphs in the elements; output staging in vaedecode ----------------------

// vaeencode ! queue ! vaedecode on the GPU over system-memory frames: the two elements share
// one backend (one stream), and with the queue they run on two threads.
std::string two_stages(int frames, const std::string& enc, const std::string& dec,
                       const char* size = "width=100,height=60") {
  return str_cat("videotestsrc num-buffers=", frames, " pattern=ball ! video/x-raw,format=RGBx,",
                 size, ",framerate=30/1 ! vaeencode model=", model(), " device=cuda ", enc,
                 " ! queue max-size-buffers=4 ! vaedecode model=", model(), " device=cuda ", dec,
                 " ! video/x-raw,format=RGBx ! fakesink name=out sync=false");
}

size_t differing_bytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// Graph replays run the same kernels with the same algorithms as the plain forward: the same
// bytes, with both elements capturing on the shared stream while the other one runs.
TEST(GstCudaPlans, GraphsOnAndOffGiveTheSameFrames) {
  PipelineRun on = run_pipeline(two_stages(12, "cuda-graphs=true", "cuda-graphs=true"));
  PipelineRun off = run_pipeline(two_stages(12, "cuda-graphs=false", "cuda-graphs=false"));
  ASSERT_TRUE(on.ok) << on.error;
  ASSERT_TRUE(off.ok) << off.error;
  ASSERT_EQ(on.frames.size(), 12u);
  ASSERT_EQ(off.frames.size(), 12u);
  for (size_t i = 0; i < on.frames.size(); ++i) {
    // Identical expected; a level of bf16 noise on a few bytes is tolerated.
    EXPECT_LE(mean_abs_diff(on.frames[i], off.frames[i]), 0.05) << "frame " << i;
    EXPECT_EQ(on.pts[i], off.pts[i]);
  }
  std::printf("graphs on vs off: frame 0 differs in %zu of %zu bytes\n",
              differing_bytes(on.frames[0], off.frames[0]), on.frames[0].size());
}

// Each frame size gets its own plans (built at negotiation), matching the unplanned run. (A
// caps change mid-stream is covered by the CPU element tests, which use the same code path.)
TEST(GstCudaPlans, EachSizeIsPlannedAndMatchesTheUnplannedRun) {
  for (const char* size : {"width=100,height=60", "width=64,height=48", "width=1920,height=1080"}) {
    SCOPED_TRACE(size);
    PipelineRun on = run_pipeline(two_stages(3, "cuda-graphs=true", "cuda-graphs=true", size));
    PipelineRun off = run_pipeline(two_stages(3, "cuda-graphs=false", "cuda-graphs=false", size));
    ASSERT_TRUE(on.ok && off.ok) << on.error << off.error;
    ASSERT_EQ(on.frames.size(), 3u);
    ASSERT_EQ(off.frames.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_LE(mean_abs_diff(on.frames[i], off.frames[i]), 0.05);
  }
}

// Output staging: the same frames, in order, with their own timestamps; EOS drains them all.
TEST(GstCudaPlans, StagedDecodeMatchesUnstagedAndEosDrainsEveryFrame) {
  for (int frames : {1, 2, 5, 9}) {
    SCOPED_TRACE(frames);
    PipelineRun staged = run_pipeline(two_stages(frames, "prefetch-depth=0", "prefetch-depth=3"));
    PipelineRun direct = run_pipeline(two_stages(frames, "prefetch-depth=0", "prefetch-depth=0"));
    ASSERT_TRUE(staged.ok) << staged.error;
    ASSERT_TRUE(direct.ok) << direct.error;
    ASSERT_EQ(staged.frames.size(), size_t(frames));
    ASSERT_EQ(direct.frames.size(), size_t(frames));
    for (int i = 0; i < frames; ++i) {
      EXPECT_EQ(staged.frames[i], direct.frames[i]) << "frame " << i;
      EXPECT_EQ(staged.pts[i], gst_util_uint64_scale(i, GST_SECOND, 30)) << "frame " << i;
      // fakesink offers no pool: the frames come in page-locked buffers the GPU copied into
      EXPECT_EQ(staged.memory[i], "LatentPinnedHost") << "frame " << i;
      EXPECT_EQ(direct.memory[i], "LatentPinnedHost") << "frame " << i;
    }
  }
}

// LATENCY answers count the frames vaedecode holds for its downloads.
TEST(GstCudaPlans, LatencyIncludesStagedFrames) {
  PipelineRun staged = run_pipeline(two_stages(6, "prefetch-depth=0", "prefetch-depth=4"));
  PipelineRun direct = run_pipeline(two_stages(6, "prefetch-depth=0", "prefetch-depth=0"));
  ASSERT_TRUE(staged.ok && direct.ok) << staged.error << direct.error;
  ASSERT_TRUE(GST_CLOCK_TIME_IS_VALID(staged.latency_min));
  ASSERT_TRUE(GST_CLOCK_TIME_IS_VALID(direct.latency_min));
  // Four frames of 1/30 s held back (processing times differ a little between the runs).
  EXPECT_GE(staged.latency_min, direct.latency_min + 3 * GST_SECOND / 30)
      << staged.latency_min << " ns vs " << direct.latency_min << " ns";
}

#ifdef LATENT_HAVE_CUDA
// A latent written by queue_tensor_to_device_latent() is complete once its fence's wait()
// returns, with the same bytes as the synchronous write, also with a long kernel queued ahead;
// fence() after a device frame's read passes only once the frame has been read.
TEST(CudaFrames, QueuedLatentWritesAndFences) {
  auto cuda = backend("cuda");
  ASSERT_TRUE(cuda);
  Tensor host = Tensor::empty({1, 16, 45, 80}, DType::kF32);
  std::vector<float> v(static_cast<size_t>(host.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.01f * static_cast<float>(i));
  std::memcpy(host.data(), v.data(), v.size() * sizeof(float));
  auto latent = cuda->upload(host);
  ASSERT_TRUE(latent.ok()) << latent.status().message();
  const size_t bytes = static_cast<size_t>(host.numel()) * 2;
  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, bytes), cudaSuccess);
  ASSERT_TRUE(tensor_to_device_latent(*cuda, *latent, a, DType::kBF16).ok());
  // Work ahead of the queued write on the same stream: a few big additions.
  auto big = cuda->zeros({1, 64, 1080, 1920});
  ASSERT_TRUE(big.ok());
  Tensor sum = *big;
  for (int i = 0; i < 8; ++i) {
    auto s2 = cuda->add(sum, *big);
    ASSERT_TRUE(s2.ok());
    sum = *s2;
  }
  auto fence = queue_tensor_to_device_latent(*cuda, *latent, b, DType::kBF16);
  ASSERT_TRUE(fence.ok()) << fence.status().message();
  ASSERT_TRUE((*fence)->wait().ok());
  std::vector<uint8_t> ha(bytes), hb(bytes);
  // Plain cudaMemcpy on the legacy stream: what another element's stream would see.
  ASSERT_EQ(cudaMemcpy(ha.data(), a, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(hb.data(), b, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(ha, hb);
  auto f2 = cuda->fence();
  ASSERT_TRUE(f2.ok());
  EXPECT_TRUE((*f2)->wait().ok());
  EXPECT_TRUE((*f2)->wait().ok());  // passed fences stay passed
  sum = Tensor();
  *big = Tensor();
  ASSERT_TRUE(cuda->synchronize().ok());
  cudaFree(a);
  cudaFree(b);
  // The CPU backend's fence is passed at once.
  auto cpu = backend("cpu");
  ASSERT_TRUE(cpu);
  auto f3 = cpu->fence();
  ASSERT_TRUE(f3.ok());
  EXPECT_TRUE((*f3)->wait().ok());
}
#endif

#ifdef LATENT_HAVE_CUDA
// ||a - b|| / ||b|| of two fp32 host tensors of one size.
double host_rel_l2(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double num = 0, den = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
    const double d = a.data_as<float>()[i] - b.data_as<float>()[i];
    num += d * d;
    den += double(b.data_as<float>()[i]) * b.data_as<float>()[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Backend::queue_wait: a latent written on one backend's stream (bf16) and read on another's
// (fp16; backends are per device and dtype, each with its stream) is read whole when the reader
// waits on the write's fence on the device, and a read queued behind other work still sees the
// old latent when the writer waits on the read's fence before writing again. Each side's own
// stream is kept busy first, so without the waits the other side would run ahead.
TEST(CudaFrames, QueueWaitOrdersAnotherBackendsStream) {
  BackendOptions ob, oh;
  ob.device = oh.device = "cuda";
  ob.dtype = "bf16";
  oh.dtype = "fp16";
  auto writer_r = get_backend(ob), reader_r = get_backend(oh);
  ASSERT_TRUE(writer_r.ok() && reader_r.ok());
  Backend& writer = **writer_r;
  Backend& reader = **reader_r;
  ASSERT_NE(&writer, &reader);
  const Shape shape{1, 16, 45, 80};
  const size_t count = static_cast<size_t>(shape_numel(shape)), bytes = count * 2;
  auto latent_of = [&](float phase) {
    Tensor host = Tensor::empty(shape, DType::kF32);
    for (size_t i = 0; i < count; ++i)
      host.data_as<float>()[i] = std::sin(0.01f * static_cast<float>(i) + phase);
    return host;
  };
  void* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(buf, 0, bytes), cudaSuccess);
  const Tensor first = latent_of(0.0f), second = latent_of(1.0f);
  auto first_w = writer.upload(first), second_w = writer.upload(second);
  ASSERT_TRUE(first_w.ok() && second_w.ok());
  ASSERT_TRUE(writer.synchronize().ok());

  // Write behind busy work on the writer's stream; the reader waits on its fence.
  queue_busy_work(writer, 12);
  auto written = queue_tensor_to_device_latent(writer, *first_w, buf, DType::kBF16);
  ASSERT_TRUE(written.ok()) << written.status().message();
  ASSERT_TRUE(reader.queue_wait(**written).ok());
  auto read1 = device_latent_to_tensor(reader, buf, DType::kBF16, 16, 45, 80);
  ASSERT_TRUE(read1.ok()) << read1.status().message();
  auto host1 = reader.download(*read1);
  ASSERT_TRUE(host1.ok());
  // bf16 values read into fp16: within bf16's rounding of the source.
  EXPECT_LT(host_rel_l2(*host1, first), 1e-2);

  // A read behind busy work on the reader's stream; the writer waits on its fence.
  queue_busy_work(reader, 12);
  auto read2 = device_latent_to_tensor(reader, buf, DType::kBF16, 16, 45, 80);
  ASSERT_TRUE(read2.ok());
  auto read_done = reader.fence();
  ASSERT_TRUE(read_done.ok());
  ASSERT_TRUE(writer.queue_wait(**read_done).ok());
  auto rewritten = queue_tensor_to_device_latent(writer, *second_w, buf, DType::kBF16);
  ASSERT_TRUE(rewritten.ok());
  auto host2 = reader.download(*read2);
  ASSERT_TRUE(host2.ok());
  EXPECT_LT(host_rel_l2(*host2, first), 1e-2) << "the read saw the next write";
  ASSERT_TRUE((*rewritten)->wait().ok());
  auto read3 = device_latent_to_tensor(reader, buf, DType::kBF16, 16, 45, 80);
  ASSERT_TRUE(read3.ok());
  auto host3 = reader.download(*read3);
  ASSERT_TRUE(host3.ok());
  EXPECT_LT(host_rel_l2(*host3, second), 1e-2);
  read1 = read2 = read3 = Status::error("freed");
  first_w = second_w = Status::error("freed");
  ASSERT_TRUE(writer.synchronize().ok() && reader.synchronize().ok());
  cudaFree(buf);
}
#endif

// The download stager against tensor_to_frame(): same bytes, one device-to-host copy a frame,
// Plays `p` from NULL to EOS and back to NULL; the frames of its fakesink "out".
std::vector<std::vector<uint8_t>> play_once(GstElement* p) {
  std::vector<std::vector<uint8_t>> frames;
  GstElement* sink = gst_bin_get_by_name(GST_BIN(p), "out");
  g_object_set(sink, "signal-handoffs", TRUE, nullptr);
  const gulong id = g_signal_connect(
      sink, "handoff", G_CALLBACK(+[](GstElement*, GstBuffer* buf, GstPad*, gpointer data) {
        GstMapInfo m;
        if (gst_buffer_map(buf, &m, GST_MAP_READ)) {
          static_cast<std::vector<std::vector<uint8_t>>*>(data)->emplace_back(m.data,
                                                                              m.data + m.size);
          gst_buffer_unmap(buf, &m);
        }
      }),
      &frames);
  EXPECT_EQ(test::play_to_end(p, 120 * GST_SECOND), "");
  g_signal_handler_disconnect(sink, id);
  gst_object_unref(sink);
  return frames;
}

guint64 plans_reused(GstElement* p, const char* name) {
  GstElement* e = gst_bin_get_by_name(GST_BIN(p), name);
  guint64 n = 0;
  if (e) g_object_get(e, "plans-reused", &n, nullptr);
  if (e) gst_object_unref(e);
  return n;
}

// A pipeline restarted clip after clip (the precompute job) while another user keeps the model
// loaded: each stage's second start takes over the plan its first stop left with the model (no
// warm-up, no capture) and gives the same bytes. Without that other user the model, and the
// plans with it, go at stop, and the next start plans again.
TEST(GstCudaPlans, APlanLeftAtStopServesTheNextStart) {
  GError* err = nullptr;
  GstElement* holder = gst_parse_launch(
      str_cat("vaeencode model=", model(), " device=cuda ! vaedecode model=", model(),
              " device=cuda ! fakesink")
          .c_str(),
      &err);
  ASSERT_TRUE(holder) << (err ? err->message : "");
  ASSERT_NE(gst_element_set_state(holder, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
  GstElement* p =
      gst_parse_launch(two_stages(4, "name=enc", "name=dec", "width=96,height=64").c_str(), &err);
  ASSERT_TRUE(p) << (err ? err->message : "");
  auto first = play_once(p);
  EXPECT_EQ(plans_reused(p, "enc"), 0u);
  EXPECT_EQ(plans_reused(p, "dec"), 0u);
  auto second = play_once(p);
  EXPECT_EQ(plans_reused(p, "enc"), 1u);
  EXPECT_EQ(plans_reused(p, "dec"), 1u);
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(first, second);
  gst_element_set_state(holder, GST_STATE_NULL);
  gst_object_unref(holder);
  auto third = play_once(p);  // the model was freed with its parked plans: planned again
  EXPECT_EQ(plans_reused(p, "enc"), 1u);
  EXPECT_EQ(first, third);
  gst_object_unref(p);
}

// in order, `depth` frames in flight; a frame too many is refused, not overwritten.
TEST(CudaFrames, DownloadedFramesMatchTensorToFrame) {
  auto cuda = backend("cuda");
  ASSERT_TRUE(cuda);
  std::unique_ptr<FrameDownloader> downloader = made(create_frame_downloader(*cuda, 2));
  ASSERT_TRUE(downloader);
  const FrameGeometry g = plan(80, 56, SizePolicy::kScale);
  const std::vector<HostFrame> inputs = host_frames(8, FrameFormat::kRGB, 80, 56, 300);
  std::deque<std::pair<uint64_t, int>> queued;
  int fetched = 0;
  for (int i = 0; i < 8; ++i) {
    auto image = frame_to_tensor(*cuda, inputs[i].desc, g);
    ASSERT_TRUE(image.ok()) << image.status().message();
    reset_transfer_counts();
    auto t = downloader->queue(*image, g, FrameFormat::kBGRx);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_EQ(transfer_counts().device_to_host, 1);
    EXPECT_EQ(transfer_counts().device_to_host_bytes, 80 * 56 * 4);
    queued.emplace_back(*t, i);
    if (queued.size() <= 2) continue;
    HostFrame staged(FrameFormat::kBGRx, 80, 56, 0), direct(FrameFormat::kBGRx, 80, 56, 0);
    const int k = queued.front().second;
    ASSERT_TRUE(downloader->fetch(queued.front().first, staged.desc).ok());
    queued.pop_front();
    auto again = frame_to_tensor(*cuda, inputs[k].desc, g);
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE(tensor_to_frame(*cuda, *again, g, direct.desc).ok());
    // Only the pixels of each row are written (the stride's 12 extra bytes stay as they were).
    for (int y = 0; y < 56; ++y)
      EXPECT_EQ(
          0, std::memcmp(static_cast<uint8_t*>(staged.desc.planes[0]) + y * staged.desc.strides[0],
                         static_cast<uint8_t*>(direct.desc.planes[0]) + y * direct.desc.strides[0],
                         80 * 4))
          << "frame " << k << " row " << y;
    ++fetched;
  }
  EXPECT_EQ(fetched, 6);
  // Three in flight with depth 2: a fourth is refused.
  auto image = frame_to_tensor(*cuda, inputs[0].desc, g);
  ASSERT_TRUE(image.ok());
  ASSERT_TRUE(downloader->queue(*image, g, FrameFormat::kBGRx).ok());
  EXPECT_FALSE(downloader->queue(*image, g, FrameFormat::kBGRx).ok());
  // Fetching out of order or a wrong frame size is an error, not a crash.
  HostFrame small(FrameFormat::kBGRx, 40, 28, 0);
  EXPECT_FALSE(downloader->fetch(queued.front().first, small.desc).ok());
  downloader->reset();
  EXPECT_TRUE(downloader->queue(*image, g, FrameFormat::kBGRx).ok());
  // Straight into a page-locked host frame: the same bytes, fetch() writes nothing more and
  // refuses any other frame.
  {
    const size_t stride = 80 * 4 + 12, bytes = stride * 56;
    auto pinned = alloc_pinned_host(0, bytes);
    ASSERT_TRUE(pinned.ok()) << pinned.status().message();
    std::memset(*pinned, 0xAB, bytes);
    FrameDesc into;
    into.format = FrameFormat::kBGRx;
    into.width = 80;
    into.height = 56;
    into.planes[0] = *pinned;
    into.strides[0] = stride;
    downloader->reset();
    auto img = frame_to_tensor(*cuda, inputs[3].desc, g);
    ASSERT_TRUE(img.ok());
    auto t = downloader->queue(*img, g, FrameFormat::kBGRx, &into);
    ASSERT_TRUE(t.ok()) << t.status().message();
    HostFrame other(FrameFormat::kBGRx, 80, 56, 0), expect(FrameFormat::kBGRx, 80, 56, 0);
    EXPECT_FALSE(downloader->fetch(*t, other.desc).ok());  // waits, then refuses: slot freed
    auto t2 = downloader->queue(*img, g, FrameFormat::kBGRx, &into);
    ASSERT_TRUE(t2.ok()) << t2.status().message();
    ASSERT_TRUE(downloader->fetch(*t2, into).ok());
    ASSERT_TRUE(tensor_to_frame(*cuda, *img, g, expect.desc).ok());
    for (int y = 0; y < 56; ++y) {
      const auto* row = static_cast<const uint8_t*>(*pinned) + y * stride;
      EXPECT_EQ(
          0, std::memcmp(row,
                         static_cast<uint8_t*>(expect.desc.planes[0]) + y * expect.desc.strides[0],
                         80 * 4))
          << "row " << y;
      EXPECT_EQ(row[80 * 4], 0xAB) << "row " << y << ": past the pixels";
    }
    // A host frame of another size is refused at queue().
    into.width = 40;
    EXPECT_FALSE(downloader->queue(*img, g, FrameFormat::kBGRx, &into).ok());
    free_pinned_host(0, *pinned);
  }
}

// ---- GPU-resident buffers between the elements (elements/gstlatentcuda.h) --------------------

// Runs `description` with the counters reset when the first frame reaches the element named
// "enc" (the models are loaded and their weights uploaded by then).
PipelineRun run_counted(const std::string& description) {
  return test::run_counted(description, "enc", "sink");
}

constexpr int kW = 96, kH = 64, kFrames = 3;

// vaeencode ! <latent caps> ! vaedecode on the GPU, RGBA frames from and to system memory.
std::string latent_link(const char* latent_caps) {
  return str_cat("videotestsrc num-buffers=", kFrames,
                 " pattern=smpte ! video/x-raw,format=RGBA,width=", kW, ",height=", kH,
                 ",framerate=30/1 ! vaeencode name=enc model=", model(), " device=cuda ! ",
                 latent_caps, " ! vaedecode model=", model(),
                 " device=cuda ! video/x-raw,format=RGBA ! fakesink name=out sync=false");
}

void latents_stay_on_the_gpu() {
  PipelineRun dev = run_counted(latent_link("application/x-latent(memory:CUDAMemory)"));
  PipelineRun sys = run_counted(latent_link("application/x-latent(memory:SystemMemory)"));
  ASSERT_TRUE(dev.ok) << dev.error;
  ASSERT_TRUE(sys.ok) << sys.error;
  ASSERT_EQ(dev.frames.size(), size_t(kFrames));
  // Latents in the compute dtype (bf16) either way: the same bytes, so the same frames.
  EXPECT_EQ(dev.frames, sys.frames);
  const int64_t frame_bytes = int64_t(kW) * kH * 4;
  // GPU-resident: only each frame's upload and each frame's download.
  EXPECT_EQ(dev.counts.host_to_device, kFrames);
  EXPECT_EQ(dev.counts.host_to_device_bytes, kFrames * frame_bytes);
  EXPECT_EQ(dev.counts.device_to_host, kFrames);
  EXPECT_EQ(dev.counts.device_to_host_bytes, kFrames * frame_bytes);
  // System-memory latents: one latent download and one upload more per frame.
  EXPECT_EQ(sys.counts.host_to_device, 2 * kFrames);
  EXPECT_EQ(sys.counts.device_to_host, 2 * kFrames);
}

TEST(GstCudaMemory, LatentsStayOnTheGpuBetweenTheStages) {
  // Latents pushed after a host wait, and with their write's fence (GstLatentFenceMeta).
  for (const char* fenced : {"0", "1"}) {
    SCOPED_TRACE(str_cat("LATENT_FENCED_LATENTS=", fenced));
    ScopedEnv env("LATENT_FENCED_LATENTS", fenced);
    latents_stay_on_the_gpu();
  }
}

TEST(GstCudaMemory, CudaFramesInAndOutMatchSystemMemoryFrames) {
  for (const char* format : {"NV12", "RGBA", "I420"}) {
    SCOPED_TRACE(format);
    const std::string src = str_cat("videotestsrc num-buffers=", kFrames,
                                    " pattern=smpte ! video/x-raw,format=", format, ",width=", kW,
                                    ",height=", kH, ",framerate=30/1 ! ");
    const std::string stages =
        str_cat("vaeencode name=enc model=", model(), " device=cuda ! vaedecode model=", model(),
                " device=cuda ! ");
    PipelineRun dev = run_counted(
        src + "cudaupload ! video/x-raw(memory:CUDAMemory) ! " + stages +
        "video/x-raw(memory:CUDAMemory),format=RGBA ! cudadownload ! video/x-raw,format=RGBA ! "
        "fakesink name=out sync=false");
    PipelineRun sys =
        run_counted(src + stages + "video/x-raw,format=RGBA ! fakesink name=out sync=false");
    ASSERT_TRUE(same_frame_sizes(dev, sys, size_t(kFrames)));
    for (int i = 0; i < kFrames; ++i) {
      // The same kernels read the same bytes (in place instead of uploaded): bf16 tolerance.
      EXPECT_LE(mean_abs_diff(dev.frames[i], sys.frames[i]), 1.0) << "frame " << i;
    }
    // Frames and latents in CUDA memory: the engine copies nothing between host and device.
    EXPECT_EQ(dev.counts.host_to_device, 0);
    EXPECT_EQ(dev.counts.device_to_host, 0);
  }
}

// The Qwen-Image fixture pipeline (VAE, transformer) and a prompt-embeds file written from its
// reference inputs, for ditdenoise between the VAE stages.
std::string dit_prompt_file() {
  return test::dit_embeds_file("gst_cuda_dit_prompt.safetensors", "");
}

// vaeencode ! <caps> ! ditdenoise ! <caps> ! vaedecode, all on the GPU (64x96: an 8x12 latent).
std::string dit_link(const char* latent_caps, const std::string& prompt) {
  const std::string vae = dit_root() + "/vae";
  return str_cat("videotestsrc num-buffers=2 pattern=smpte ! video/x-raw,format=RGBA,width=96,",
                 "height=64,framerate=30/1 ! vaeencode name=enc model=", vae, " device=cuda ! ",
                 latent_caps, " ! ditdenoise model=", dit_root(), " prompt-embeds=", prompt,
                 " steps=2 strength=0.6 seed=7 noise-mode=fixed device=cuda ! ", latent_caps,
                 " ! vaedecode model=", vae,
                 " device=cuda ! video/x-raw,format=RGBA ! fakesink name=out sync=false");
}

void dit_denoise_takes_and_gives_cuda_latents() {
  const std::string prompt = dit_prompt_file();
  PipelineRun dev = run_counted(dit_link("application/x-latent(memory:CUDAMemory)", prompt));
  PipelineRun sys = run_counted(dit_link("application/x-latent(memory:SystemMemory)", prompt));
  ASSERT_TRUE(same_frame_sizes(dev, sys, 2u));
  for (size_t i = 0; i < 2; ++i) {
    // The loop sees the same host latents either way; only bf16 rounding of its result may
    // differ (device vs host conversion).
    EXPECT_LE(mean_abs_diff(dev.frames[i], sys.frames[i]), 1.0) << "frame " << i;
  }
  // The whole loop runs on the device (elements/gstditdenoise.cpp): with CUDA memory no latent
  // byte goes through the host, while system-memory latents go down and up twice a frame
  // (vaeencode -> ditdenoise -> vaedecode). Everything else (prompt, noise, the frames) is the
  // same in both runs.
  EXPECT_EQ(sys.counts.device_to_host - dev.counts.device_to_host, 2 * 2);
  EXPECT_EQ(sys.counts.host_to_device - dev.counts.host_to_device, 2 * 2);
}

TEST(GstCudaMemory, DitDenoiseTakesAndGivesCudaLatents) {
  // Latents pushed after a host wait, and with their write's fence (GstLatentFenceMeta).
  for (const char* fenced : {"0", "1"}) {
    SCOPED_TRACE(str_cat("LATENT_FENCED_LATENTS=", fenced));
    ScopedEnv env("LATENT_FENCED_LATENTS", fenced);
    dit_denoise_takes_and_gives_cuda_latents();
  }
}

// ---- several devices in one process (issue 14) ------------------------------------------------

#ifdef LATENT_HAVE_GST_CUDA
// The device of the CUDA context a buffer's first memory belongs to, -1 for other memory.
int memory_device(GstBuffer* buf) {
  GstMemory* mem = gst_buffer_n_memory(buf) ? gst_buffer_peek_memory(buf, 0) : nullptr;
  if (!mem || !gst_is_cuda_memory(mem)) return -1;
  gint id = -2;
  g_object_get(GST_CUDA_MEMORY_CAST(mem)->context, "cuda-device-id", &id, nullptr);
  return id;
}

// Every device id that passed one pad (pad probe data).
struct DevicesSeen {
  std::mutex lock;
  std::set<int> ids;
  int buffers = 0;
};

GstPadProbeReturn record_device(GstPad*, GstPadProbeInfo* info, gpointer data) {
  auto* seen = static_cast<DevicesSeen*>(data);
  const int id = memory_device(GST_PAD_PROBE_INFO_BUFFER(info));
  std::lock_guard<std::mutex> l(seen->lock);
  seen->ids.insert(id);
  ++seen->buffers;
  return GST_PAD_PROBE_OK;
}

void collect_frame(GstElement*, GstBuffer* buf, GstPad*, gpointer data) {
  auto* frames = static_cast<std::vector<std::vector<uint8_t>>*>(data);
  GstMapInfo m;
  if (gst_buffer_map(buf, &m, GST_MAP_READ)) {
    frames->emplace_back(m.data, m.data + m.size);
    gst_buffer_unmap(buf, &m);
  }
}

// One branch: NV12 frames uploaded by cudaupload (its device left to the context it finds, as a
// user writes it), vaeencode ! vaedecode on cuda:<device> with CUDA memory between them, the
// frames downloaded by cudadownload into fakesink out<tag> (elements enc<tag>, dec<tag>).
std::string device_branch(int device, const std::string& tag, const char* pattern) {
  return str_cat("videotestsrc num-buffers=", kFrames, " pattern=", pattern,
                 " ! video/x-raw,format=NV12,width=", kW, ",height=", kH,
                 ",framerate=30/1 ! cudaupload ! video/x-raw(memory:CUDAMemory) ! vaeencode name=enc",
                 tag, " model=", model(), " device=cuda:", device,
                 " ! application/x-latent(memory:CUDAMemory) ! vaedecode name=dec", tag,
                 " model=", model(), " device=cuda:", device,
                 " ! video/x-raw(memory:CUDAMemory),format=RGBA ! cudadownload ! "
                 "video/x-raw,format=RGBA ! fakesink name=out", tag, " sync=false ");
}

const char* const kPatterns[] = {"smpte", "ball", "checkers-8", "circular"};

TEST(GstCudaDevices, EachBranchRunsOnItsOwnDeviceInOnePipeline) {
  const int devices = std::min(cuda_device_count(), 4);
  if (devices < 2) GTEST_SKIP() << "needs two GPUs (" << devices << " here)";
  std::string description;
  for (int d = 0; d < devices; ++d) description += device_branch(d, str_cat(d), kPatterns[d]);
  GError* err = nullptr;
  GstElement* p = gst_parse_launch(description.c_str(), &err);
  ASSERT_TRUE(p) << (err ? err->message : "parse failed");
  std::vector<std::vector<std::vector<uint8_t>>> frames(devices);
  // Per branch: what reached vaeencode, what it pushed, what vaedecode pushed.
  std::vector<std::array<DevicesSeen, 3>> seen(devices);
  for (int d = 0; d < devices; ++d) {
    const std::pair<std::string, const char*> pads[3] = {
        {str_cat("enc", d), "sink"}, {str_cat("enc", d), "src"}, {str_cat("dec", d), "src"}};
    for (int k = 0; k < 3; ++k) {
      GstElement* e = gst_bin_get_by_name(GST_BIN(p), pads[k].first.c_str());
      ASSERT_TRUE(e) << pads[k].first;
      GstPad* pad = gst_element_get_static_pad(e, pads[k].second);
      gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, record_device, &seen[d][k], nullptr);
      gst_object_unref(pad);
      gst_object_unref(e);
    }
    GstElement* sink = gst_bin_get_by_name(GST_BIN(p), str_cat("out", d).c_str());
    g_object_set(sink, "signal-handoffs", TRUE, nullptr);
    g_signal_connect(sink, "handoff", G_CALLBACK(collect_frame), &frames[d]);
    gst_object_unref(sink);
  }
  const std::string result = test::play_to_end(p, 120 * GST_SECOND);
  gst_object_unref(p);
  ASSERT_EQ(result, "");
  for (int d = 0; d < devices; ++d) {
    SCOPED_TRACE(str_cat("cuda:", d));
    const char* what[3] = {"frames into vaeencode", "latents out of vaeencode",
                           "frames out of vaedecode"};
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(seen[d][k].buffers, kFrames) << what[k];
      // The CUDA memory of this branch's own device, never another's (and never system memory,
      // which a mismatched context would have forced).
      EXPECT_EQ(seen[d][k].ids, std::set<int>{d}) << what[k];
    }
    // The same frames as this branch's source gives alone on cuda:0 (the same kernels on the
    // same kind of GPU: bf16 tolerance at most).
    PipelineRun alone = run_pipeline(device_branch(0, "", kPatterns[d]));
    ASSERT_TRUE(alone.ok) << alone.error;
    ASSERT_EQ(frames[d].size(), alone.frames.size());
    for (size_t i = 0; i < alone.frames.size(); ++i) {
      ASSERT_EQ(frames[d][i].size(), alone.frames[i].size());
      EXPECT_LE(mean_abs_diff(frames[d][i], alone.frames[i]), 1.0) << "frame " << i;
    }
  }
}
#endif  // LATENT_HAVE_GST_CUDA

// ---- latents ordered on the device between stages (GstLatentFenceMeta, gstlatentcuda.h) -------

#ifdef LATENT_HAVE_GST_CUDA
// The meta's API type, registered by the plugin (not linked here: one registration a process).
GType fence_meta_api() { return g_type_from_name("GstLatentFenceMetaAPI"); }

struct LatentsSeen {
  std::mutex lock;
  int buffers = 0, with_fence = 0;
};

GstPadProbeReturn record_fence(GstPad*, GstPadProbeInfo* info, gpointer data) {
  auto* seen = static_cast<LatentsSeen*>(data);
  GstBuffer* buf = GST_PAD_PROBE_INFO_BUFFER(info);
  const GType api = fence_meta_api();
  std::lock_guard<std::mutex> l(seen->lock);
  ++seen->buffers;
  if (api && gst_buffer_get_meta(buf, api)) ++seen->with_fence;
  return GST_PAD_PROBE_OK;
}

// Plays `description` with a probe on enc's src pad; the frames of every fakesink named in
// `sinks`, in that order.
std::vector<std::vector<std::vector<uint8_t>>> play_probed(const std::string& description,
                                                           const std::vector<std::string>& sinks,
                                                           LatentsSeen* seen) {
  std::vector<std::vector<std::vector<uint8_t>>> frames(sinks.size());
  GError* err = nullptr;
  GstElement* p = gst_parse_launch(description.c_str(), &err);
  EXPECT_TRUE(p) << (err ? err->message : "parse failed");
  if (!p) return frames;
  GstElement* enc = gst_bin_get_by_name(GST_BIN(p), "enc");
  GstPad* pad = gst_element_get_static_pad(enc, "src");
  gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, record_fence, seen, nullptr);
  gst_object_unref(pad);
  gst_object_unref(enc);
  for (size_t i = 0; i < sinks.size(); ++i) {
    GstElement* sink = gst_bin_get_by_name(GST_BIN(p), sinks[i].c_str());
    g_object_set(sink, "signal-handoffs", TRUE, nullptr);
    g_signal_connect(sink, "handoff", G_CALLBACK(collect_frame), &frames[i]);
    gst_object_unref(sink);
  }
  EXPECT_EQ(test::play_to_end(p, 120 * GST_SECOND), "");
  gst_object_unref(p);
  return frames;
}

constexpr int kFenceFrames = 24, kFenceW = 1280, kFenceH = 720;

std::string fence_source() {
  return str_cat("videotestsrc num-buffers=", kFenceFrames,
                 " pattern=ball ! video/x-raw,format=RGBA,", "width=", kFenceW, ",height=", kFenceH,
                 ",framerate=30/1 ! ");
}

// vaeencode (fp16) ! latents ! vaedecode (bf16): two backends, two streams, on one GPU. Latents in
// CUDA memory are pushed as soon as their write is queued (the decoder orders its read after it)
// and the pool's buffers come back while the decoder's reads may still be queued (the encoder
// orders its next write after them): every frame is the one the same stages give with latents
// in system memory (complete on the host both ways), byte for byte.
TEST(GstCudaMemory, StagesOfTwoDtypesOnOneGpuReadEveryLatentWhole) {
  ScopedEnv env("LATENT_FENCED_LATENTS", "1");
  ASSERT_NE(fence_meta_api(), G_TYPE_INVALID) << "the plugin registers the fence meta";
  auto link = [&](const char* caps) {
    return str_cat(
        fence_source(), "vaeencode name=enc model=", model(), " device=cuda dtype=fp16 ! ", caps,
        " ! vaedecode model=", model(),
        " device=cuda dtype=bf16 ! video/x-raw,format=RGBA ! fakesink name=out sync=false");
  };
  LatentsSeen dev_seen, sys_seen;
  auto dev = play_probed(link("application/x-latent(memory:CUDAMemory)"), {"out"}, &dev_seen);
  auto sys = play_probed(link("application/x-latent(memory:SystemMemory)"), {"out"}, &sys_seen);
  ASSERT_EQ(dev[0].size(), size_t(kFenceFrames));
  ASSERT_EQ(sys[0].size(), size_t(kFenceFrames));
  for (int i = 0; i < kFenceFrames; ++i)
    EXPECT_TRUE(dev[0][i] == sys[0][i])
        << "frame " << i << ": mean abs difference " << mean_abs_diff(dev[0][i], sys[0][i]);
  // Every latent in CUDA memory carries its write's fence; none in system memory.
  EXPECT_EQ(dev_seen.with_fence, kFenceFrames);
  EXPECT_EQ(sys_seen.with_fence, 0);
}

// A reader that does not order its reads by the fence (fakesink mapping the latent through
// GStreamer's CUDA memory, as cudadownload or latentsink would) beside one that does, behind a
// tee: tee's ALLOCATION answer keeps only what every branch says, so vaeencode waits for each
// write on the host again, and the outside reader gets each latent whole (the same bytes as
// latents written to system memory), while vaedecode's frames are those of a run without the tee.
TEST(GstCudaMemory, ReadersOutsideTheStagesGetCompleteLatents) {
  ScopedEnv env("LATENT_FENCED_LATENTS", "1");
  const std::string enc =
      str_cat(fence_source(), "vaeencode name=enc model=", model(), " device=cuda ! ");
  const std::string dec =
      str_cat("vaedecode model=", model(),
              " device=cuda ! video/x-raw,format=RGBA ! fakesink name=out sync=false");
  LatentsSeen seen, plain_seen, sys_seen;
  auto both = play_probed(enc + "application/x-latent(memory:CUDAMemory) ! tee name=t ! queue ! " +
                              dec + " t. ! queue ! fakesink name=latents sync=false",
                          {"out", "latents"}, &seen);
  auto plain =
      play_probed(enc + "application/x-latent(memory:CUDAMemory) ! " + dec, {"out"}, &plain_seen);
  auto sys = play_probed(
      enc + "application/x-latent(memory:SystemMemory) ! fakesink name=latents sync=false",
      {"latents"}, &sys_seen);
  ASSERT_EQ(both[0].size(), size_t(kFenceFrames));
  ASSERT_EQ(both[1].size(), size_t(kFenceFrames));
  ASSERT_EQ(plain[0].size(), size_t(kFenceFrames));
  ASSERT_EQ(sys[0].size(), size_t(kFenceFrames));
  for (int i = 0; i < kFenceFrames; ++i) {
    SCOPED_TRACE(str_cat("frame ", i));
    // The CUDA buffer may be longer than the latent (pitched): the latent is at its start.
    ASSERT_GE(both[1][i].size(), sys[0][i].size());
    EXPECT_TRUE(std::equal(sys[0][i].begin(), sys[0][i].end(), both[1][i].begin()));
    EXPECT_EQ(both[0][i], plain[0][i]);
  }
  EXPECT_EQ(seen.with_fence, kFenceFrames);
  EXPECT_EQ(plain_seen.with_fence, kFenceFrames);
}
#endif  // LATENT_HAVE_GST_CUDA

}  // namespace
}  // namespace latent

int main(int argc, char** argv) {
  return latent::test::gst_gpu_test_main("test_gst_cuda", argc, argv);
}
