// The page-locked allocator behind vaedecode's system-memory frames on a GPU
// (elements/gstlatentcuda.h): its memory maps, shares and frees like system memory, and where
// page-locked memory cannot be had (no CUDA in this build or process, or none left) it hands out
// plain system memory instead of failing the buffer pool.
#include <gst/gst.h>
#include <gst/video/video.h>
#include <gtest/gtest.h>

#include <cstring>

#include "elements/gstlatentcuda.h"
#include "engine/backends/registry.h"

namespace {

class PinnedMemory : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { gst_init(nullptr, nullptr); }
};

// Whether this process can have page-locked memory of device 0 at all.
bool pinned_available() {
  auto p = latent::alloc_pinned_host(0, 4096);
  if (!p.ok()) return false;
  latent::free_pinned_host(0, *p);
  return true;
}

TEST_F(PinnedMemory, AllocatesMapsAndSharesOrFallsBackToSystemMemory) {
  GstAllocator* allocator = gst_latent_pinned_allocator_new(0);
  ASSERT_NE(allocator, nullptr);
  GstAllocationParams params;
  gst_allocation_params_init(&params);
  params.prefix = 64;
  params.padding = 32;
  params.flags =
      static_cast<GstMemoryFlags>(GST_MEMORY_FLAG_ZERO_PREFIXED | GST_MEMORY_FLAG_ZERO_PADDED);
  GstMemory* mem = gst_allocator_alloc(allocator, 1000, &params);
  ASSERT_NE(mem, nullptr) << "an allocation never fails for want of page-locked memory";
  const bool pinned = gst_latent_memory_is_pinned(mem);
  EXPECT_EQ(pinned, pinned_available());
  EXPECT_STREQ(mem->allocator->mem_type, pinned ? GST_LATENT_PINNED_MEMORY_TYPE : "SystemMemory");
  EXPECT_EQ(gst_memory_get_sizes(mem, nullptr, nullptr), 1000u);

  GstMapInfo w;
  ASSERT_TRUE(gst_memory_map(mem, &w, GST_MAP_WRITE));
  ASSERT_EQ(w.size, 1000u);
  for (gsize i = 0; i < w.size; ++i) w.data[i] = static_cast<guint8>(i * 7);
  if (pinned) {  // the prefix and padding were zeroed, as the flags ask
    for (gsize i = 1; i <= 64; ++i) EXPECT_EQ(w.data[-static_cast<gssize>(i)], 0) << i;
    for (gsize i = 0; i < 32; ++i) EXPECT_EQ(w.data[1000 + i], 0) << i;
  }
  gst_memory_unmap(mem, &w);

  // A share sees the same bytes from its offset and outlives the parent's last reference.
  GstMemory* part = gst_memory_share(mem, 100, 50);
  ASSERT_NE(part, nullptr);
  EXPECT_EQ(gst_latent_memory_is_pinned(part), pinned);
  gst_memory_unref(mem);
  GstMapInfo r;
  ASSERT_TRUE(gst_memory_map(part, &r, GST_MAP_READ));
  ASSERT_EQ(r.size, 50u);
  for (gsize i = 0; i < r.size; ++i) EXPECT_EQ(r.data[i], static_cast<guint8>((100 + i) * 7)) << i;
  gst_memory_unmap(part, &r);
  gst_memory_unref(part);
  gst_object_unref(allocator);
}

// A buffer pool configured with it (as vaedecode's decide_allocation does) gives video buffers
// that map as frames, whichever memory they got.
TEST_F(PinnedMemory, AVideoPoolWithItGivesWritableFrames) {
  GstVideoInfo info;
  gst_video_info_set_format(&info, GST_VIDEO_FORMAT_RGBx, 70, 30);
  GstCaps* caps = gst_video_info_to_caps(&info);
  GstAllocator* allocator = gst_latent_pinned_allocator_new(0);
  GstBufferPool* pool = gst_video_buffer_pool_new();
  GstStructure* config = gst_buffer_pool_get_config(pool);
  gst_buffer_pool_config_set_params(config, caps, static_cast<guint>(GST_VIDEO_INFO_SIZE(&info)), 0,
                                    0);
  gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
  GstAllocationParams params;
  gst_allocation_params_init(&params);
  gst_buffer_pool_config_set_allocator(config, allocator, &params);
  ASSERT_TRUE(gst_buffer_pool_set_config(pool, config));
  ASSERT_TRUE(gst_buffer_pool_set_active(pool, TRUE));
  for (int i = 0; i < 3; ++i) {
    GstBuffer* buf = nullptr;
    ASSERT_EQ(gst_buffer_pool_acquire_buffer(pool, &buf, nullptr), GST_FLOW_OK);
    EXPECT_EQ(gst_latent_memory_is_pinned(gst_buffer_peek_memory(buf, 0)), pinned_available());
    GstVideoFrame frame;
    ASSERT_TRUE(gst_video_frame_map(&frame, &info, buf, GST_MAP_WRITE));
    std::memset(GST_VIDEO_FRAME_PLANE_DATA(&frame, 0), i,
                static_cast<size_t>(GST_VIDEO_FRAME_PLANE_STRIDE(&frame, 0)) * 30);
    gst_video_frame_unmap(&frame);
    gst_buffer_unref(buf);
  }
  ASSERT_TRUE(gst_buffer_pool_set_active(pool, FALSE));
  gst_object_unref(pool);
  gst_object_unref(allocator);
  gst_caps_unref(caps);
}

}  // namespace
