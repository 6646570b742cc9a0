#include "engine/core/arena_plan.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace latent {
namespace {

constexpr int64_t kForever = INT64_MAX;

int64_t death(const ArenaBuffer& b) { return b.died < 0 ? kForever : b.died; }

bool lifetimes_overlap(const ArenaBuffer& a, const ArenaBuffer& b) {
  return a.born < death(b) && b.born < death(a);
}

enum class Fit { kLowest, kTightest };

// Places the buffers in `order`, each at the lowest (or the tightest) gap between the placed
// buffers whose lifetimes overlap its own.
ArenaPlan place(const std::vector<ArenaBuffer>& buffers, const std::vector<size_t>& order,
                Fit fit) {
  ArenaPlan plan;
  plan.offsets.assign(buffers.size(), 0);
  std::vector<size_t> placed;
  placed.reserve(buffers.size());
  std::vector<std::pair<size_t, size_t>> busy;  // [offset, end) of lifetime-overlapping ones
  for (size_t i : order) {
    const ArenaBuffer& b = buffers[i];
    busy.clear();
    for (size_t j : placed)
      if (lifetimes_overlap(b, buffers[j]))
        busy.push_back({plan.offsets[j], plan.offsets[j] + buffers[j].bytes});
    std::sort(busy.begin(), busy.end());
    size_t off = 0, best = 0, best_gap = SIZE_MAX;
    bool found = false;
    for (const auto& [start, end] : busy) {
      if (start >= off && start - off >= b.bytes) {
        const size_t gap = start - off;
        if (fit == Fit::kLowest) {
          best = off;
          found = true;
          break;
        }
        if (gap < best_gap) {
          best_gap = gap;
          best = off;
          found = true;
        }
      }
      off = std::max(off, end);
    }
    if (!found) best = off;  // above every busy buffer
    plan.offsets[i] = best;
    plan.bytes = std::max(plan.bytes, best + b.bytes);
    placed.push_back(i);
  }
  return plan;
}

std::vector<size_t> identity(size_t n) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  return order;
}

std::vector<size_t> by_size(const std::vector<ArenaBuffer>& buffers) {
  std::vector<size_t> order = identity(buffers.size());
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });
  return order;
}

}  // namespace

std::vector<size_t> arena_alive_at_peak(const std::vector<ArenaBuffer>& buffers) {
  // The peak is reached at an allocation: the clock of the first allocation after which the
  // live bytes equal the peak.
  const size_t peak = arena_live_peak(buffers);
  std::vector<int64_t> births;
  births.reserve(buffers.size());
  for (const ArenaBuffer& b : buffers) births.push_back(b.born);
  std::sort(births.begin(), births.end());
  for (int64_t t : births) {
    size_t live = 0;
    std::vector<size_t> alive;
    for (size_t i = 0; i < buffers.size(); ++i)
      if (buffers[i].born <= t && t < death(buffers[i])) {
        live += buffers[i].bytes;
        alive.push_back(i);
      }
    if (live == peak) return alive;
  }
  return {};
}

size_t arena_live_peak(const std::vector<ArenaBuffer>& buffers) {
  std::vector<std::pair<int64_t, int64_t>> events;  // (clock, +bytes / -bytes); frees first
  events.reserve(2 * buffers.size());
  for (const ArenaBuffer& b : buffers) {
    events.push_back({b.born, static_cast<int64_t>(b.bytes)});
    if (b.died >= 0) events.push_back({b.died, -static_cast<int64_t>(b.bytes)});
  }
  std::sort(events.begin(), events.end());
  int64_t live = 0, peak = 0;
  for (const auto& [clock, delta] : events) {
    live += delta;
    peak = std::max(peak, live);
  }
  return static_cast<size_t>(peak);
}

ArenaPlan plan_arena(const std::vector<ArenaBuffer>& buffers) {
  const size_t peak = arena_live_peak(buffers);
  const size_t n = buffers.size();
  // Longest-lived first (ties: larger first): the buffers that pin the layout longest go low.
  std::vector<size_t> by_life = identity(n);
  std::stable_sort(by_life.begin(), by_life.end(), [&](size_t a, size_t b) {
    const int64_t la = death(buffers[a]) - buffers[a].born,
                  lb = death(buffers[b]) - buffers[b].born;
    return la != lb ? la > lb : buffers[a].bytes > buffers[b].bytes;
  });
  // Size x lifetime first (the area a buffer takes in the offset-time plane).
  std::vector<size_t> by_area = identity(n);
  const int64_t end_clock = [&] {
    int64_t e = 0;
    for (const ArenaBuffer& b : buffers) e = std::max({e, b.born + 1, b.died + 1});
    return e;
  }();
  auto area = [&](size_t i) {
    const int64_t life = std::min(death(buffers[i]), end_clock) - buffers[i].born;
    return static_cast<double>(buffers[i].bytes) * static_cast<double>(std::max<int64_t>(life, 1));
  };
  std::stable_sort(by_area.begin(), by_area.end(),
                   [&](size_t a, size_t b) { return area(a) > area(b); });
  const std::vector<size_t> size_order = by_size(buffers), alloc_order = identity(n);
  struct Candidate {
    const std::vector<size_t>* order;
    Fit fit;
    const char* name;
  };
  const Candidate candidates[] = {
      {&size_order, Fit::kLowest, "largest first, lowest gap"},
      {&size_order, Fit::kTightest, "largest first, tightest gap"},
      {&by_area, Fit::kLowest, "largest size x lifetime first, lowest gap"},
      {&by_life, Fit::kLowest, "longest-lived first, lowest gap"},
      {&alloc_order, Fit::kTightest, "in allocation order, tightest gap"},
      {&by_area, Fit::kTightest, "largest size x lifetime first, tightest gap"},
  };
  ArenaPlan best;
  bool have = false;
  size_t first = 0;
  for (const Candidate& c : candidates) {
    ArenaPlan plan = place(buffers, *c.order, c.fit);
    plan.placement = c.name;
    if (!have) first = plan.bytes;
    if (!have || plan.bytes < best.bytes) {
      best = std::move(plan);
      have = true;
    }
    if (best.bytes <= peak) break;
  }
  best.live_peak = peak;
  best.largest_first_bytes = first;
  return best;
}

bool arena_plan_valid(const std::vector<ArenaBuffer>& buffers, const ArenaPlan& plan) {
  if (plan.offsets.size() != buffers.size()) return false;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (plan.offsets[i] + buffers[i].bytes > plan.bytes) return false;
    for (size_t j = i + 1; j < buffers.size(); ++j) {
      if (!lifetimes_overlap(buffers[i], buffers[j])) continue;
      const size_t a0 = plan.offsets[i], a1 = a0 + buffers[i].bytes;
      const size_t b0 = plan.offsets[j], b1 = b0 + buffers[j].bytes;
      if (buffers[i].bytes > 0 && buffers[j].bytes > 0 && a0 < b1 && b0 < a1) return false;
    }
  }
  return true;
}

}  // namespace latent
