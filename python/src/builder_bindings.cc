// Mask builders, benchmark families and document lengths. Keyword names are the C++ parameter
// names, and every default comes from the C++ side (FamilySpec{}, Window{}), so the two APIs
// cannot drift apart. Integer inputs accept lists, numpy arrays and CPU torch tensors.
#include <nanobind/nanobind.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "magi/doc_lengths.h"
#include "magi/error.h"
#include "magi/mask_builders.h"
#include "magi/mask_families.h"

namespace magi::py {
namespace {

using namespace nb::literals;

std::vector<std::int64_t> read_vector(nb::handle obj, const char* name) {
  return read_ints(obj, name, 1).values;
}

// q and k documents pair up; None for cu_seqlens_k means self-attention.
template <typename Build>
Mask varlen(nb::handle cu_q, nb::handle cu_k, Build build) {
  const std::vector<std::int64_t> q = read_vector(cu_q, "cu_seqlens_q");
  if (cu_k.is_none()) return build(q, q);
  return build(q, read_vector(cu_k, "cu_seqlens_k"));
}

std::int64_t num_blocks(std::int64_t seqlen, std::int64_t block) {
  return block > 0 ? (seqlen + block - 1) / block : 0;
}

// A [nq, nk] block mask read as [nk, nq] would pass a size check and be silently wrong.
void check_block_shape(const FlagArray& a, std::int64_t seqlen_q, std::int64_t seqlen_k,
                       std::int64_t block_q, std::int64_t block_k) {
  if (block_q <= 0 || block_k <= 0) return;  // the builder names the bad block size
  const std::int64_t nq = num_blocks(seqlen_q, block_q), nk = num_blocks(seqlen_k, block_k);
  MAGI_CHECK((a.shape[0] == nq && a.shape[1] == nk) || (a.values.empty() && nq * nk == 0),
             "block_mask: shape [", a.shape[0], ", ", a.shape[1],
             "] is not [ceil(seqlen_q / block_q), ceil(seqlen_k / block_k)] = [", nq, ", ", nk,
             "]");
}

DocLengthHistogram histogram(const std::optional<std::filesystem::path>& csv_path) {
  return csv_path ? DocLengthHistogram::from_csv(csv_path->string())
                  : DocLengthHistogram::builtin();
}

void bind_mask_builders(nb::module_& m) {
  m.def("full", &masks::full, "seqlen_q"_a, "seqlen_k"_a);
  m.def("causal", &masks::causal, "seqlen_q"_a, "seqlen_k"_a);
  m.def(
      "varlen_full",
      [](nb::handle cu_q, nb::handle cu_k) {
        return varlen(cu_q, cu_k,
                      [](const auto& q, const auto& k) { return masks::varlen_full(q, k); });
      },
      "cu_seqlens_q"_a, "cu_seqlens_k"_a.none() = nb::none());
  m.def(
      "varlen_causal",
      [](nb::handle cu_q, nb::handle cu_k) {
        return varlen(cu_q, cu_k,
                      [](const auto& q, const auto& k) { return masks::varlen_causal(q, k); });
      },
      "cu_seqlens_q"_a, "cu_seqlens_k"_a.none() = nb::none());
  m.def(
      "sliding_window",
      [](std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t left, std::int64_t right) {
        return masks::sliding_window(seqlen_q, seqlen_k, masks::Window{left, right});
      },
      "seqlen_q"_a, "seqlen_k"_a, "left"_a, "right"_a);
  m.def(
      "varlen_sliding_window",
      [](nb::handle cu_q, nb::handle cu_k, std::int64_t left, std::int64_t right,
         std::int64_t num_global) {
        return varlen(cu_q, cu_k, [&](const auto& q, const auto& k) {
          return masks::varlen_sliding_window(q, k, masks::Window{left, right}, num_global);
        });
      },
      "cu_seqlens_q"_a, "cu_seqlens_k"_a.none() = nb::none(), "left"_a = masks::Window{}.left,
      "right"_a = masks::Window{}.right, "num_global"_a = 0);
  m.def("block_causal", &masks::block_causal, "seqlen"_a, "block"_a);
  m.def(
      "varlen_block_causal",
      [](nb::handle cu, std::int64_t block, bool last_block_global) {
        return masks::varlen_block_causal(read_vector(cu, "cu_seqlens"), block, last_block_global);
      },
      "cu_seqlens"_a, "block"_a, "last_block_global"_a = false);
  m.def("prefix_lm", &masks::prefix_lm, "seqlen"_a, "prefix_len"_a);
  m.def(
      "shared_question",
      [](std::int64_t question_len, nb::handle answer_lens) {
        return masks::shared_question(question_len, read_vector(answer_lens, "answer_lens"));
      },
      "question_len"_a, "answer_lens"_a);
  m.def(
      "block_sparse",
      [](nb::handle block_mask, std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t block_q,
         std::int64_t block_k) {
        const FlagArray a = read_flags(block_mask, "block_mask", 2);
        check_block_shape(a, seqlen_q, seqlen_k, block_q, block_k);
        return masks::block_sparse(a.values, seqlen_q, seqlen_k, block_q, block_k);
      },
      "block_mask"_a, "seqlen_q"_a, "seqlen_k"_a, "block_q"_a, "block_k"_a);
  m.def(
      "block_sparse_topk",
      [](nb::handle indices, std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t block_q,
         std::int64_t block_k) {
        const IntArray a = read_ints(indices, "indices", 2);
        return masks::block_sparse_topk(a.values, a.shape[1], seqlen_q, seqlen_k, block_q, block_k);
      },
      "indices"_a, "seqlen_q"_a, "seqlen_k"_a, "block_q"_a, "block_k"_a);
  m.def(
      "from_dense",
      [](nb::handle dense) {
        const FlagArray a = read_flags(dense, "dense", 2);
        return masks::from_dense(a.values, a.shape[0], a.shape[1]);
      },
      "dense"_a);
}

void bind_families(nb::module_& m) {
  const FamilySpec defaults;
  m.def(
      "build_family",
      [](const std::string& name, std::int64_t seqlen, std::uint64_t seed, std::int64_t window,
         std::int64_t block, double density, std::int64_t prefix_len, std::int64_t max_doc_len,
         const std::optional<std::filesystem::path>& doc_lengths) {
        FamilySpec spec;
        spec.family = name;
        spec.seqlen = seqlen;
        spec.seed = seed;
        spec.window = window;
        spec.block = block;
        spec.density = density;
        spec.prefix_len = prefix_len;
        spec.max_doc_len = max_doc_len;
        if (doc_lengths) spec.doc_lengths = histogram(doc_lengths);
        return build_family(spec);
      },
      "name"_a, "seqlen"_a, "seed"_a = defaults.seed, nb::kw_only(), "window"_a = defaults.window,
      "block"_a = defaults.block, "density"_a = defaults.density,
      "prefix_len"_a = defaults.prefix_len, "max_doc_len"_a = defaults.max_doc_len,
      "doc_lengths"_a.none() = nb::none(),
      "doc_lengths: a CSV histogram path (None: the built-in published one)");
  m.def("family_names", [] {
    std::vector<std::string> names;
    for (std::string_view n : family_names()) names.emplace_back(n);
    return names;
  });
  m.def(
      "sample_doc_lengths",
      [](std::int64_t total, std::int64_t max_len, std::uint64_t seed,
         const std::optional<std::filesystem::path>& csv_path) {
        std::vector<std::int64_t> lengths =
            sample_doc_lengths(histogram(csv_path), total, max_len, seed);
        const std::size_t n = lengths.size();
        return to_numpy(std::move(lengths), {n});
      },
      "total"_a, "max_len"_a = 0, "seed"_a = 0, "csv_path"_a.none() = nb::none());
  m.def(
      "cu_seqlens_from_lengths",
      [](nb::handle lengths) {
        std::vector<std::int64_t> cu = cu_seqlens_from_lengths(read_vector(lengths, "lengths"));
        const std::size_t n = cu.size();
        return to_numpy(std::move(cu), {n});
      },
      "lengths"_a);
}

}  // namespace

void bind_builders(nb::module_& m) {
  bind_mask_builders(m);
  bind_families(m);
}

}  // namespace magi::py
