// A mask prepared for many calls (docs/semantics.md §2): the validated Mask plus what each
// backend derives from it, built on first use and then reused. The GPU forward keeps its work
// list (tiles and pieces of the tile shape of a head dim) resident in device memory here, so
// a call that passes a PreparedMask does no host work that grows with the mask, no upload and
// no allocation (with a workspace, attention.h). The distributed runtime prepares each
// stage's slices once per plan; the Python front keeps one per cached mask.
//
// Thread-safe. Device memory is freed by the destructor, which waits for the work that may
// still read it (cudaFree); a PreparedMask must outlive every CUDA graph that captured a call
// using it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "magi/mask.h"

namespace magi {

// What a backend keeps per (device, key) of a PreparedMask; it frees its own memory.
struct PreparedState {
  virtual ~PreparedState() = default;
  virtual std::size_t device_bytes() const = 0;
};

class PreparedMask {
 public:
  explicit PreparedMask(Mask mask) : mask_(std::move(mask)) {}
  PreparedMask(const PreparedMask&) = delete;
  PreparedMask& operator=(const PreparedMask&) = delete;

  const Mask& mask() const { return mask_; }

  // Device memory held over every device and key built so far.
  std::size_t device_bytes() const;
  // How many (device, key) states are built: a test's view of "prepared once".
  std::size_t num_states() const;

  // The state for (device, key), built by `build` on first request (under the lock, so two
  // threads never build the same one); it lives as long as this object.
  const PreparedState& state(int device, int key,
                             const std::function<std::unique_ptr<PreparedState>()>& build) const;

 private:
  struct Entry {
    int device, key;
    std::unique_ptr<PreparedState> state;
  };
  Mask mask_;
  mutable std::mutex mu_;
  mutable std::vector<Entry> states_;
};

}  // namespace magi
