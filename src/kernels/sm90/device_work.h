// Work lists on the device, for the sm90 forward and backward (forward.cu, backward.cu): the
// host image of a work list (tiles, pieces and, for a prepared mask, the slices that the
// forward's pre-pass compares the caller's device ranges with), and its resident copy owned by
// a PreparedMask, one per (device, tile shape, axis).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "magi/mask.h"
#include "magi/prepared.h"
#include "work_list.h"

namespace magi::kernels::sm90 {

// Tiles, then pieces, then the slices as int32 (q0, q1, k0, k1, type), then for key tiles the
// deterministic backward's tickets (dq_tickets, work_list.h), 16-byte aligned parts.
struct WorkImage {
  std::vector<unsigned char> bytes;
  std::size_t pieces_off = 0, slices_off = 0, tickets_off = 0;
  std::int32_t num_tiles = 0;
};

WorkImage work_image(const Mask& mask, std::int32_t block_m, std::int32_t block_n,
                     TileAxis axis, bool with_slices);

// A work list resident on one device (with the slices), owned by a PreparedMask.
class DeviceWork final : public PreparedState {
 public:
  DeviceWork(const Mask& mask, int device, std::int32_t block_m, std::int32_t block_n,
             TileAxis axis);
  ~DeviceWork() override;
  DeviceWork(const DeviceWork&) = delete;
  DeviceWork& operator=(const DeviceWork&) = delete;
  std::size_t device_bytes() const override { return bytes_; }
  const Tile* tiles() const { return static_cast<const Tile*>(dev_); }
  const Piece* pieces() const {
    return reinterpret_cast<const Piece*>(static_cast<const unsigned char*>(dev_) + pieces_off_);
  }
  std::int32_t num_tiles() const { return num_tiles_; }
  const std::int32_t* slices() const {
    return reinterpret_cast<const std::int32_t*>(static_cast<const unsigned char*>(dev_) +
                                                 slices_off_);
  }
  const std::int32_t* tickets() const {
    return reinterpret_cast<const std::int32_t*>(static_cast<const unsigned char*>(dev_) +
                                                 tickets_off_);
  }

 private:
  void* dev_ = nullptr;
  std::size_t bytes_ = 0, pieces_off_ = 0, slices_off_ = 0, tickets_off_ = 0;
  std::int32_t num_tiles_ = 0;
};

// The prepared mask's work list for this device, tile shape and axis (built on first use).
const DeviceWork& device_work(const PreparedMask& prepared, int device, std::int32_t block_m,
                              std::int32_t block_n, TileAxis axis);

}  // namespace magi::kernels::sm90
