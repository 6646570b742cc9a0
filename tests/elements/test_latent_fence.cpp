// The fence meta that orders a latent's write and its reads between stages on the device
// (GstLatentFenceMeta, elements/gstlatentcuda.h), on the CPU: the write's fence goes on a meta
// that stays with the pool's buffer, a reader waits for it, the reads recorded on it reach the
// buffer's next write, copies of the buffer share it, and ALLOCATION answers say who orders
// their reads by it. (On a GPU, tests/gpu/test_gst_cuda.cpp runs it between two CUDA streams.)
// All of it is behind LATENT_FENCED_LATENTS=1 for now, which these tests set.
#include <gst/gst.h>
#include <gtest/gtest.h>

#include <memory>

#include "elements/gstlatentcuda.h"
#include "engine/backends/registry.h"

namespace {

class LatentFence : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { gst_init(nullptr, nullptr); }
  void SetUp() override {
    // The fences are behind this switch until a GPU has run them (read on every call).
    g_setenv("LATENT_FENCED_LATENTS", "1", TRUE);
    latent::BackendOptions o;
    o.device = "cpu";
    auto b = latent::get_backend(o);
    ASSERT_TRUE(b.ok()) << b.status().message();
    cpu_ = *b;
  }
  void TearDown() override { g_unsetenv("LATENT_FENCED_LATENTS"); }
  std::shared_ptr<latent::Backend> cpu_;
};

// A fence that counts its waits (the CPU backend's queue_wait waits on the host).
class CountingFence final : public latent::DeviceFence {
 public:
  explicit CountingFence(int* waits) : waits_(waits) {}
  latent::Status wait() override {
    ++*waits_;
    return latent::ok_status();
  }

 private:
  int* waits_;
};

GstMeta* fence_meta(GstBuffer* buffer) {
  return gst_buffer_get_meta(buffer, GST_LATENT_FENCE_META_API_TYPE);
}

// A pool of one 64-byte buffer, active.
GstBufferPool* one_buffer_pool() {
  GstBufferPool* pool = gst_buffer_pool_new();
  GstStructure* config = gst_buffer_pool_get_config(pool);
  gst_buffer_pool_config_set_params(config, nullptr, 64, 1, 1);
  EXPECT_TRUE(gst_buffer_pool_set_config(pool, config));
  EXPECT_TRUE(gst_buffer_pool_set_active(pool, TRUE));
  return pool;
}

TEST_F(LatentFence, TheWritesFenceStaysWithThePoolsBufferAndOrdersReadsAndTheNextWrite) {
  GstBufferPool* pool = one_buffer_pool();
  GstBuffer* buf = nullptr;
  ASSERT_EQ(gst_buffer_pool_acquire_buffer(pool, &buf, nullptr), GST_FLOW_OK);
  // No meta (a foreign writer's latent): nothing to order, nothing recorded.
  EXPECT_EQ(fence_meta(buf), nullptr);
  EXPECT_TRUE(gst_latent_buffer_order_read(buf, *cpu_).ok());
  EXPECT_TRUE(gst_latent_buffer_add_read(buf, *cpu_).ok());
  EXPECT_EQ(gst_latent_buffer_reads_pending(buf), 0u);
  EXPECT_EQ(fence_meta(buf), nullptr);

  int first_waits = 0, second_waits = 0;
  EXPECT_TRUE(gst_latent_buffer_order_write(buf, *cpu_).ok());
  gst_latent_buffer_set_written(buf, std::make_shared<CountingFence>(&first_waits));
  GstMeta* meta = fence_meta(buf);
  ASSERT_NE(meta, nullptr);
  EXPECT_TRUE(GST_META_FLAG_IS_SET(meta, GST_META_FLAG_POOLED));
  EXPECT_EQ(first_waits, 0) << "the writer does not wait for its own write";
  // Two readers: each waits for the write, and each records its read.
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(gst_latent_buffer_order_read(buf, *cpu_).ok());
    EXPECT_TRUE(gst_latent_buffer_add_read(buf, *cpu_).ok());
  }
  EXPECT_EQ(first_waits, 2);
  EXPECT_EQ(gst_latent_buffer_reads_pending(buf), 2u);

  // Back to the pool and out again (a pool of one: the same buffer): the meta, and the reads on
  // it, are still there for the next write.
  gst_buffer_pool_release_buffer(pool, buf);
  GstBuffer* again = nullptr;
  ASSERT_EQ(gst_buffer_pool_acquire_buffer(pool, &again, nullptr), GST_FLOW_OK);
  ASSERT_EQ(again, buf);
  EXPECT_EQ(fence_meta(again), meta);
  EXPECT_EQ(gst_latent_buffer_reads_pending(again), 2u);
  EXPECT_TRUE(gst_latent_buffer_order_write(again, *cpu_).ok());
  EXPECT_EQ(gst_latent_buffer_reads_pending(again), 0u) << "the write ordered after both reads";
  gst_latent_buffer_set_written(again, std::make_shared<CountingFence>(&second_waits));
  EXPECT_EQ(fence_meta(again), meta) << "one meta a buffer, whatever the number of writes";
  EXPECT_TRUE(gst_latent_buffer_order_read(again, *cpu_).ok());
  EXPECT_EQ(first_waits, 2);
  EXPECT_EQ(second_waits, 1) << "a reader waits for the latest write only";
  gst_buffer_pool_release_buffer(pool, again);
  EXPECT_TRUE(gst_buffer_pool_set_active(pool, FALSE));
  gst_object_unref(pool);
}

TEST_F(LatentFence, OffByDefaultNothingIsAttachedOrOffered) {
  g_unsetenv("LATENT_FENCED_LATENTS");
  EXPECT_FALSE(gst_latent_fences_on());
  GstBuffer* buf = gst_buffer_new_allocate(nullptr, 64, nullptr);
  int waits = 0;
  gst_latent_buffer_set_written(buf, std::make_shared<CountingFence>(&waits));
  EXPECT_EQ(fence_meta(buf), nullptr);
  EXPECT_TRUE(gst_latent_buffer_order_read(buf, *cpu_).ok());
  EXPECT_EQ(waits, 0);
  gst_buffer_unref(buf);
  g_setenv("LATENT_FENCED_LATENTS", "0", TRUE);
  EXPECT_FALSE(gst_latent_fences_on());
  g_setenv("LATENT_FENCED_LATENTS", "on", TRUE);
  EXPECT_TRUE(gst_latent_fences_on());
}

TEST_F(LatentFence, AReaderOnTheHostWaitsForTheWrite) {
  GstBuffer* buf = gst_buffer_new_allocate(nullptr, 64, nullptr);
  EXPECT_TRUE(gst_latent_buffer_wait_written(buf).ok()) << "no meta: nothing to wait for";
  int waits = 0;
  gst_latent_buffer_set_written(buf, std::make_shared<CountingFence>(&waits));
  EXPECT_TRUE(gst_latent_buffer_wait_written(buf).ok());
  EXPECT_EQ(waits, 1);
  EXPECT_EQ(gst_latent_buffer_reads_pending(buf), 0u) << "a read on the host is done on return";
  gst_buffer_unref(buf);
}

TEST_F(LatentFence, CopiesOfTheBufferShareItsFences) {
  GstBuffer* buf = gst_buffer_new_allocate(nullptr, 64, nullptr);
  int waits = 0;
  gst_latent_buffer_set_written(buf, std::make_shared<CountingFence>(&waits));
  GstBuffer* copy = gst_buffer_copy(buf);
  ASSERT_NE(fence_meta(copy), nullptr);
  EXPECT_TRUE(gst_latent_buffer_order_read(copy, *cpu_).ok());
  EXPECT_EQ(waits, 1) << "a reader of the copy waits for the original's write";
  EXPECT_TRUE(gst_latent_buffer_add_read(copy, *cpu_).ok());
  EXPECT_EQ(gst_latent_buffer_reads_pending(buf), 1u)
      << "its read reaches the original's next write";
  gst_buffer_unref(copy);
  EXPECT_EQ(gst_latent_buffer_reads_pending(buf), 1u);
  // A buffer that is not writable gets no meta of its own (its writer adds it before pushing).
  GstBuffer* plain = gst_buffer_new_allocate(nullptr, 64, nullptr);
  GstBuffer* shared = gst_buffer_ref(plain);
  gst_latent_buffer_set_written(plain, std::make_shared<CountingFence>(&waits));
  EXPECT_EQ(fence_meta(plain), nullptr);
  gst_buffer_unref(shared);
  gst_buffer_unref(plain);
  gst_buffer_unref(buf);
}

TEST_F(LatentFence, AllocationAnswersSayWhoOrdersTheirReads) {
  GstCaps* caps = gst_caps_from_string("application/x-latent");
  GstQuery* query = gst_query_new_allocation(caps, TRUE);
  EXPECT_FALSE(gst_latent_query_orders_reads(query)) << "an answer without the meta";
  gst_query_add_allocation_meta(query, GST_LATENT_FENCE_META_API_TYPE, nullptr);
  EXPECT_TRUE(gst_latent_query_orders_reads(query));
  EXPECT_FALSE(gst_latent_query_orders_reads(nullptr));
  gst_query_unref(query);
  gst_caps_unref(caps);
}

}  // namespace
