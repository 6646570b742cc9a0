// engine/core/arena_plan: the graph captures' static memory layout (backends/cuda/memory.cpp).
#include <gtest/gtest.h>

#include <cstdio>
#include <iterator>
#include <random>
#include <vector>

#include "engine/core/arena_plan.h"

namespace latent {
namespace {

TEST(ArenaPlan, Empty) {
  const ArenaPlan plan = plan_arena({});
  EXPECT_EQ(plan.bytes, 0u);
  EXPECT_TRUE(plan.offsets.empty());
  EXPECT_EQ(plan.live_peak, 0u);
}

// A chain of layers (each output alive until the next layer's output is made) needs two
// buffers' room at most: the arena is the live peak.
TEST(ArenaPlan, ChainIsTight) {
  std::vector<ArenaBuffer> buffers;
  const size_t sizes[] = {100, 400, 400, 200, 800, 800, 300};
  int64_t clock = 0;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    buffers.push_back({sizes[i], clock++, -1});
    if (i > 0) buffers[i - 1].died = clock++;
  }
  const ArenaPlan plan = plan_arena(buffers);
  EXPECT_TRUE(arena_plan_valid(buffers, plan));
  EXPECT_EQ(plan.live_peak, 1600u);
  EXPECT_EQ(plan.bytes, plan.live_peak) << plan.placement;
}

// Sizes 2, 4, 5, 6 (allocation order) where placing the largest first at the lowest free
// offset leaves a hole: 12 units, against 11 alive at most, which another order reaches.
TEST(ArenaPlan, BeatsLargestFirst) {
  const std::vector<ArenaBuffer> buffers = {{2, 0, 3}, {4, 1, 6}, {5, 2, 4}, {6, 5, 7}};
  const ArenaPlan plan = plan_arena(buffers);
  EXPECT_TRUE(arena_plan_valid(buffers, plan));
  EXPECT_EQ(plan.live_peak, 11u);
  EXPECT_EQ(plan.largest_first_bytes, 12u);
  EXPECT_EQ(plan.bytes, 11u) << plan.placement;
}

// The buffers alive at the peak: sizes 4 and 5 (clock 2-3) make 11 with the 2 still alive.
TEST(ArenaPlan, AliveAtPeak) {
  const std::vector<ArenaBuffer> buffers = {{2, 0, 3}, {4, 1, 6}, {5, 2, 4}, {6, 5, 7}};
  EXPECT_EQ(arena_alive_at_peak(buffers), (std::vector<size_t>{0, 1, 2}));
  EXPECT_TRUE(arena_alive_at_peak({}).empty());
}

// Buffers never freed stay alive to the end: nothing allocated later may take their room.
TEST(ArenaPlan, NeverFreedStaysReserved) {
  const std::vector<ArenaBuffer> buffers = {{64, 0, -1}, {32, 1, 2}, {64, 3, -1}, {16, 4, 5}};
  const ArenaPlan plan = plan_arena(buffers);
  EXPECT_TRUE(arena_plan_valid(buffers, plan));
  EXPECT_EQ(plan.live_peak, 144u);
  EXPECT_EQ(plan.bytes, 144u);
  EXPECT_NE(plan.offsets[0], plan.offsets[2]);
}

// Random forwards (buffers of VAE-like sizes, each freed after a few later allocations, some
// never): every layout is valid, at least the live peak and never worse than largest-first.
TEST(ArenaPlan, RandomForwardsAreValid) {
  std::mt19937_64 rng(27);
  int better = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 60);
    std::vector<ArenaBuffer> buffers;
    std::vector<int> pending;  // indexes not yet freed
    int64_t clock = 0;
    for (int i = 0; i < n; ++i) {
      const size_t mib = size_t{1} << (rng() % 6);
      buffers.push_back({mib * 256 * (1 + rng() % 3), clock++, -1});
      pending.push_back(i);
      while (pending.size() > 1 + rng() % 4) {
        const size_t k = rng() % pending.size();
        if (rng() % 8 != 0) buffers[pending[k]].died = clock++;  // 1 in 8: never freed
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
    const ArenaPlan plan = plan_arena(buffers);
    ASSERT_TRUE(arena_plan_valid(buffers, plan)) << "trial " << trial;
    EXPECT_GE(plan.bytes, plan.live_peak) << "trial " << trial;
    EXPECT_LE(plan.bytes, plan.largest_first_bytes) << "trial " << trial;
    if (plan.bytes < plan.largest_first_bytes) ++better;
  }
  std::printf("  %d of 300 random forwards laid out tighter than largest-first\n", better);
}

// The validity check itself rejects overlapping live buffers and buffers past the arena.
TEST(ArenaPlan, ValidityCheckRejectsOverlap) {
  const std::vector<ArenaBuffer> buffers = {{8, 0, 3}, {8, 1, 2}};
  ArenaPlan overlapping;
  overlapping.offsets = {0, 4};
  overlapping.bytes = 12;
  EXPECT_FALSE(arena_plan_valid(buffers, overlapping));
  ArenaPlan outside;
  outside.offsets = {0, 8};
  outside.bytes = 12;
  EXPECT_FALSE(arena_plan_valid(buffers, outside));
  ArenaPlan fine;
  fine.offsets = {0, 8};
  fine.bytes = 16;
  EXPECT_TRUE(arena_plan_valid(buffers, fine));
}

}  // namespace
}  // namespace latent
