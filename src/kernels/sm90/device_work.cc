#include "device_work.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <mutex>

#include "host_common.h"
#include "magi/error.h"

#define MAGI_CUDA_CHECK(expr, what) MAGI_CUDA_CHECK_IN("GPU work list", expr, what)

namespace magi::kernels::sm90 {
namespace {

// One stream per device for the uploads of prepared work lists: the host waits for its copy
// only, never for the compute queued on the caller's stream.
cudaStream_t upload_stream(int device) {
  static std::mutex mu;
  static std::array<cudaStream_t, 64> streams{};
  MAGI_CHECK(device >= 0 && device < int(streams.size()), "GPU work list: device ", device,
             " beyond the ", streams.size(), " this build supports");
  std::lock_guard<std::mutex> lock(mu);
  cudaStream_t& s = streams[std::size_t(device)];
  if (s == nullptr) MAGI_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                                    "upload stream");
  return s;  // kept for the process (destroying it at exit could outlive the driver)
}

}  // namespace

WorkImage work_image(const Mask& mask, std::int32_t block_m, std::int32_t block_n,
                     TileAxis axis, bool with_slices) {
  const WorkList w = make_work_list(mask, block_m, block_n, axis);
  WorkImage img;
  const std::size_t tiles_bytes = w.tiles.size() * sizeof(Tile);
  img.pieces_off = align16(tiles_bytes);
  img.slices_off = align16(img.pieces_off + w.pieces.size() * sizeof(Piece));
  std::vector<std::int32_t> slices;
  if (with_slices)
    for (const Slice& sl : mask.slices())  // make_work_list checked the 32-bit range
      slices.insert(slices.end(), {std::int32_t(sl.q_range.start), std::int32_t(sl.q_range.end),
                                   std::int32_t(sl.k_range.start), std::int32_t(sl.k_range.end),
                                   std::int32_t(sl.type)});
  const std::vector<std::int32_t> tickets = dq_tickets(w, mask.total_seqlen_q());
  img.tickets_off = align16(img.slices_off + slices.size() * sizeof(std::int32_t));
  img.bytes.assign(img.tickets_off + tickets.size() * sizeof(std::int32_t), 0);
  std::memcpy(img.bytes.data(), w.tiles.data(), tiles_bytes);
  std::memcpy(img.bytes.data() + img.pieces_off, w.pieces.data(), w.pieces.size() * sizeof(Piece));
  std::memcpy(img.bytes.data() + img.slices_off, slices.data(),
              slices.size() * sizeof(std::int32_t));
  std::memcpy(img.bytes.data() + img.tickets_off, tickets.data(),
              tickets.size() * sizeof(std::int32_t));
  img.num_tiles = std::int32_t(w.tiles.size());
  return img;
}

DeviceWork::DeviceWork(const Mask& mask, int device, std::int32_t block_m, std::int32_t block_n,
                       TileAxis axis) {
  const WorkImage img = work_image(mask, block_m, block_n, axis, true);
  num_tiles_ = img.num_tiles;
  slices_off_ = img.slices_off;
  pieces_off_ = img.pieces_off;
  tickets_off_ = img.tickets_off;
  bytes_ = std::max<std::size_t>(img.bytes.size(), 16);
  RelaxedCapture relaxed;
  MAGI_CUDA_CHECK(cudaMalloc(&dev_, bytes_), "prepared work list allocation");
  const cudaStream_t s = upload_stream(device);
  cudaError_t e = cudaMemcpyAsync(dev_, img.bytes.data(), img.bytes.size(),
                                  cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) cudaFree(dev_);
  MAGI_CUDA_CHECK(e, "prepared work list upload");
}

DeviceWork::~DeviceWork() {
  RelaxedCapture relaxed;
  cudaFree(dev_);  // waits for the kernels that may still read it
}

const DeviceWork& device_work(const PreparedMask& prepared, int device, std::int32_t block_m,
                              std::int32_t block_n, TileAxis axis) {
  // One key per tile shape and axis: block sizes below 2^12.
  const int key = (axis == TileAxis::kKey ? 1 << 30 : 0) | block_m << 16 | block_n;
  return static_cast<const DeviceWork&>(prepared.state(device, key, [&] {
    return std::make_unique<DeviceWork>(prepared.mask(), device, block_m, block_n, axis);
  }));
}

}  // namespace magi::kernels::sm90
