#include "magi/prepared.h"

namespace magi {

std::size_t PreparedMask::device_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (const Entry& e : states_) n += e.state->device_bytes();
  return n;
}

std::size_t PreparedMask::num_states() const {
  std::lock_guard<std::mutex> lock(mu_);
  return states_.size();
}

const PreparedState& PreparedMask::state(
    int device, int key, const std::function<std::unique_ptr<PreparedState>()>& build) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : states_)
    if (e.device == device && e.key == key) return *e.state;
  states_.push_back(Entry{device, key, build()});
  return *states_.back().state;
}

}  // namespace magi
