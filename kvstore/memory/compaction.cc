#include "kvstore/memory/compaction.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/strings/str_format.h"

namespace sluice::kvstore {
namespace {

// A "unit" is an aligned group of `group` slots: unit u covers slots [u * group, (u + 1) * group).

// Live units of one page.
int64_t LiveUnits(const SlotBitmapView& v, int32_t group) {
  if (v.used_slots <= 0) return 0;
  if (group == 1) return CountValid(v.words, v.used_slots);
  int64_t units = 0;
  for (int64_t s = FindFirstSet(v.words, v.used_slots, 0); s >= 0;
       s = FindFirstSet(v.words, v.used_slots, (s / group + 1) * group)) {
    ++units;
  }
  return units;
}

// The first live unit at or after unit u, or -1.
int64_t NextLiveUnit(const SlotBitmapView& v, int32_t group, int64_t u) {
  const int64_t s = FindFirstSet(v.words, v.used_slots, u * group);
  return s < 0 ? -1 : s / group;
}

// The first dead unit at or after unit u, or `units` when there is none.
int64_t NextDeadUnit(const SlotBitmapView& v, int32_t group, int64_t units, int64_t u) {
  const int64_t used = v.used_slots;
  if (u >= units) return units;
  if (group == 1) {
    if (u >= used) return u;
    const int64_t s = FindFirstClear(v.words, used, u);
    return s >= 0 ? s : used;  // used == units: no room
  }
  for (; u < units; ++u) {
    const int64_t lo = u * group;
    if (lo >= used) return u;
    if (FindFirstSet(v.words, std::min<int64_t>(used, lo + group), lo) < 0) return u;
  }
  return units;
}

}  // namespace

absl::StatusOr<CompactionPlan> PlanCompaction(absl::Span<const SlotBitmapView> pages,
                                              int32_t slots_per_page, int32_t group) {
  if (slots_per_page <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("compaction needs slots_per_page > 0, not %d", slots_per_page));
  }
  if (group <= 0 || slots_per_page % group != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("compaction group %d must be positive and divide the %d slots of a page",
                        group, slots_per_page));
  }
  if (pages.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot plan the compaction of %d pages at once", pages.size()));
  }
  const int32_t n = static_cast<int32_t>(pages.size());
  for (int32_t i = 0; i < n; ++i) {
    const SlotBitmapView& v = pages[i];
    if (v.used_slots < 0 || v.used_slots > slots_per_page) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "page %d of the list has %d used slots; a page has %d", i, v.used_slots, slots_per_page));
    }
    if (v.used_slots > 0 && v.words == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("page %d of the list has %d used slots but no bitmap", i, v.used_slots));
    }
  }
  const int64_t units = slots_per_page / group;

  CompactionPlan plan;
  std::vector<int64_t> live(n);
  int64_t total_live = 0;
  plan.used_before.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    live[i] = LiveUnits(pages[i], group);
    total_live += live[i];
    plan.used_before[i] = pages[i].used_slots;
  }
  plan.pages_after = static_cast<int32_t>((total_live + units - 1) / units);

  // Keep the fullest pages: they hold the most live units, so the fewest move.
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return live[a] > live[b]; });
  std::vector<bool> kept(n, false);
  for (int32_t k = 0; k < plan.pages_after; ++k) kept[order[k]] = true;

  std::vector<int32_t> destinations;  // kept pages, ascending
  plan.used_after = plan.used_before;
  for (int32_t i = 0; i < n; ++i) {
    if (kept[i]) {
      destinations.push_back(i);
    } else {
      plan.freed.push_back(i);
      plan.used_after[i] = 0;
    }
  }

  // Destination cursor: the next dead unit of destinations[d].
  size_t d = 0;
  int64_t dst_unit = 0;
  auto next_hole = [&]() -> bool {
    while (d < destinations.size()) {
      dst_unit = NextDeadUnit(pages[destinations[d]], group, units, dst_unit);
      if (dst_unit < units) return true;
      ++d;
      dst_unit = 0;
    }
    return false;
  };
  for (int32_t src = n - 1; src >= 0; --src) {
    if (kept[src]) continue;
    for (int64_t u = NextLiveUnit(pages[src], group, 0); u >= 0;
         u = NextLiveUnit(pages[src], group, u + 1)) {
      if (!next_hole()) {
        // Cannot happen: the kept pages have room for every live unit by construction.
        return absl::InternalError(
            absl::StrFormat("compaction ran out of room with %d live groups on %d kept pages",
                            total_live, plan.pages_after));
      }
      const int32_t dst = destinations[d];
      const int32_t src_slot = static_cast<int32_t>(u * group);
      const int32_t dst_slot = static_cast<int32_t>(dst_unit * group);
      SlotMove* last = plan.moves.empty() ? nullptr : &plan.moves.back();
      if (last != nullptr && last->src_page == src && last->dst_page == dst &&
          last->src_slot + last->slots == src_slot && last->dst_slot + last->slots == dst_slot) {
        last->slots += group;
      } else {
        plan.moves.push_back({.src_page = src,
                              .src_slot = src_slot,
                              .dst_page = dst,
                              .dst_slot = dst_slot,
                              .slots = group});
      }
      plan.used_after[dst] = std::max(plan.used_after[dst], dst_slot + group);
      ++dst_unit;
    }
  }
  return plan;
}

std::vector<int32_t> FindEmptyPages(absl::Span<const SlotBitmapView> pages) {
  std::vector<int32_t> empty;
  for (size_t i = 0; i < pages.size(); ++i) {
    const SlotBitmapView& v = pages[i];
    if (v.used_slots <= 0 || v.words == nullptr || CountValid(v.words, v.used_slots) == 0) {
      empty.push_back(static_cast<int32_t>(i));
    }
  }
  return empty;
}

absl::Status ApplyCompaction(const CompactionPlan& plan, absl::Span<uint64_t* const> bitmaps,
                             absl::FunctionRef<void(const SlotMove&)> copy_slots) {
  const size_t n = plan.used_after.size();
  if (plan.used_before.size() != n || bitmaps.size() != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ApplyCompaction: the plan covers %d pages (%d before) but %d bitmaps were given", n,
        plan.used_before.size(), bitmaps.size()));
  }
  for (size_t i = 0; i < n; ++i) {
    if (bitmaps[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("ApplyCompaction: page %d of the list has no bitmap", i));
    }
  }
  for (const SlotMove& m : plan.moves) {
    const bool pages_ok = m.src_page >= 0 && m.src_page < static_cast<int64_t>(n) &&
                          m.dst_page >= 0 && m.dst_page < static_cast<int64_t>(n);
    if (!pages_ok || m.slots < 0 || m.src_slot < 0 || m.dst_slot < 0 ||
        int64_t{m.dst_slot} + m.slots > plan.used_after[m.dst_page]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ApplyCompaction: move of %d slots from page %d slot %d to page %d slot %d does not "
          "fit the %d-page plan",
          m.slots, m.src_page, m.src_slot, m.dst_page, m.dst_slot, n));
    }
  }
  // Slots a kept page gains past its old used_slots may hold stale bits: start them clear.
  for (size_t i = 0; i < n; ++i) {
    for (int32_t s = plan.used_before[i]; s < plan.used_after[i]; ++s) ClearSlot(bitmaps[i], s);
  }
  for (const SlotMove& m : plan.moves) {
    copy_slots(m);
    uint64_t* src = bitmaps[m.src_page];
    uint64_t* dst = bitmaps[m.dst_page];
    const int32_t src_used = plan.used_before[m.src_page];
    for (int32_t k = 0; k < m.slots; ++k) {
      const int32_t s = m.src_slot + k;
      if (s < src_used && TestSlot(src, s)) {
        SetSlot(dst, m.dst_slot + k);
      } else {
        ClearSlot(dst, m.dst_slot + k);
      }
      ClearSlot(src, s);
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice::kvstore
