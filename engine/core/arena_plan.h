// Static memory planning: the buffers of one recorded forward (sizes and lifetimes) laid out in
// one arena so that buffers alive at the same time never overlap. The CUDA backend's graph
// captures take their buffers from such an arena (backends/cuda/memory.cpp); GStreamer- and
// CUDA-free so that it is tested on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace latent {

struct ArenaBuffer {
  size_t bytes = 0;
  int64_t born = 0;   // event clock of its allocation
  int64_t died = -1;  // event clock of its free; -1: never freed (alive to the end)
};

struct ArenaPlan {
  std::vector<size_t> offsets;     // one per buffer, in the input's order
  size_t bytes = 0;                // the arena's size: the highest offset + size
  size_t live_peak = 0;            // the most bytes alive at once: no layout needs less
  const char* placement = "";      // the heuristic that gave this layout (logs, tests)
  size_t largest_first_bytes = 0;  // the arena of the first placement alone (largest first,
                                   // lowest gap: the only one before session 27)
};

// The most bytes alive at once (a lower bound on any layout's arena).
size_t arena_live_peak(const std::vector<ArenaBuffer>& buffers);

// The buffers alive at the first moment the live peak is reached (indexes, in the input's
// order): what a plan's memory is made of (logs).
std::vector<size_t> arena_alive_at_peak(const std::vector<ArenaBuffer>& buffers);

// Lays the buffers out with several greedy placements (largest first / longest-lived first /
// in allocation order; lowest or tightest gap) and keeps the smallest arena; stops early at
// the live peak.
ArenaPlan plan_arena(const std::vector<ArenaBuffer>& buffers);

// Whether `plan` places every buffer inside its arena and no two buffers alive at the same
// time overlap (tests).
bool arena_plan_valid(const std::vector<ArenaBuffer>& buffers, const ArenaPlan& plan);

}  // namespace latent
