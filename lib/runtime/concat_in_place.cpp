#include "runtime/concat_in_place.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <utility>

namespace mpq::rt {

namespace {
std::atomic<int64_t> g_joined{0};

// Slices start on cache-line boundaries (64 bytes, host_alloc's alignment), so a producer's
// vector stores into its slice run as fast as into a buffer of its own.
constexpr int64_t kSliceAlign = 64;
}  // namespace

bool concat_in_place_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MPQ_CONCAT_IN_PLACE");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

int64_t InPlaceConcats::joined_count() { return g_joined.load(std::memory_order_relaxed); }

void InPlaceConcats::plan(const std::vector<const ir::Node*>& nodes, const std::vector<std::vector<int>>& inputs,
                          const std::vector<std::vector<int>>& outputs, size_t slots,
                          const std::vector<int>& graph_outputs) {
  concats_.clear();
  concat_of_step_.assign(nodes.size(), -1);
  produces_slice_.assign(nodes.size(), 0);
  slice_of_slot_.assign(slots, {-1, -1});
  std::vector<int> producer(slots, -1);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int s : outputs[i])
      if (s >= 0) producer[static_cast<size_t>(s)] = static_cast<int>(i);
  std::vector<char> is_output(slots, 0);
  for (int s : graph_outputs) is_output[static_cast<size_t>(s)] = 1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = *nodes[i];
    if (!n.domain.empty() || n.op_type != "Concat" || inputs[i].size() < 2) continue;
    const std::vector<int>& ins = inputs[i];
    bool ok = true;
    for (size_t k = 0; k < ins.size() && ok; ++k) {
      const int s = ins[k];
      // Computed by a step (the plan is topological, so an earlier one), not a graph output, not
      // already another Concat's slice, read once here.
      ok = s >= 0 && producer[static_cast<size_t>(s)] >= 0 && !is_output[static_cast<size_t>(s)] &&
           slice_of_slot_[static_cast<size_t>(s)].first < 0 && std::count(ins.begin(), ins.end(), s) == 1;
    }
    if (!ok) continue;
    const int c = static_cast<int>(concats_.size());
    Concat cc;
    cc.axis = n.attr_int("axis", 1);
    concats_.push_back(std::move(cc));
    concat_of_step_[i] = c;
    for (size_t k = 0; k < ins.size(); ++k) {
      slice_of_slot_[static_cast<size_t>(ins[k])] = {c, static_cast<int>(k)};
      produces_slice_[static_cast<size_t>(producer[static_cast<size_t>(ins[k])])] = 1;
    }
  }
}

void InPlaceConcats::begin_run() {
  for (Concat& c : concats_) c.buffer = Tensor();
}

bool InPlaceConcats::prefer_outputs(int step, const std::vector<int>& out_slots, std::vector<Tensor>& preferred) {
  // Most steps produce no slice: one lookup, nothing allocated (a transformer's 100 small steps).
  if (!produces_slice_[static_cast<size_t>(step)]) return false;
  bool any = false;
  preferred.assign(out_slots.size(), Tensor());
  for (size_t i = 0; i < out_slots.size(); ++i) {
    const int s = out_slots[i];
    if (s < 0) continue;
    const auto [c, k] = slice_of_slot_[static_cast<size_t>(s)];
    if (c < 0) continue;
    Concat& cc = concats_[static_cast<size_t>(c)];
    if (!cc.armed) continue;
    if (!cc.buffer.defined()) cc.buffer = Tensor(cc.dtype, cc.out_shape);
    // The aliasing constructor: the view owns the whole buffer, points at its slice.
    std::shared_ptr<void> at(cc.buffer.buffer(),
                             static_cast<char*>(cc.buffer.raw_data()) + cc.offsets[static_cast<size_t>(k)]);
    preferred[i] = Tensor::wrap(cc.dtype, cc.in_shapes[static_cast<size_t>(k)], std::move(at));
    any = true;
  }
  return any;
}

bool InPlaceConcats::try_join(int c, const std::vector<const Tensor*>& ins, Tensor& out) {
  Concat& cc = concats_[static_cast<size_t>(c)];
  Tensor buffer = std::exchange(cc.buffer, Tensor());
  if (!cc.armed || !buffer.defined() || ins.size() != cc.in_shapes.size()) return false;
  const char* base = static_cast<const char*>(buffer.raw_data());
  const std::shared_ptr<void>& owner = buffer.buffer();
  bool shapes_as_armed = true, in_place = true;
  for (size_t k = 0; k < ins.size(); ++k) {
    const Tensor* t = ins[k];
    if (!t || t->dtype() != cc.dtype || t->shape() != cc.in_shapes[k]) {
      shapes_as_armed = false;
      continue;
    }
    // A view of this buffer (the same owner; Tensor::same_buffer compares addresses) at its slice.
    in_place = in_place && !owner.owner_before(t->buffer()) && !t->buffer().owner_before(owner) &&
               static_cast<const char*>(t->raw_data()) == base + cc.offsets[k];
  }
  if (!shapes_as_armed) return false;  // the next run is armed with the new shapes
  if (!in_place) {
    // Same shapes, yet a producer handed over a tensor of its own (Identity, Reshape, a kernel
    // that computes in place, a Concat feeding this one): it will do so again, and the buffer
    // made for the slices would be one more output-sized allocation per run for nothing.
    cc.never = true;
    return false;
  }
  out = std::move(buffer);
  g_joined.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void InPlaceConcats::remember(int c, const std::vector<const Tensor*>& ins, const Tensor& out) {
  Concat& cc = concats_[static_cast<size_t>(c)];
  cc.armed = false;
  if (cc.never || !out.defined() || !out.is_host() || out.dtype() == DType::String || out.rank() == 0) return;
  const int64_t axis = cc.axis < 0 ? cc.axis + out.rank() : cc.axis;
  if (axis < 0 || axis >= out.rank()) return;
  for (int64_t d = 0; d < axis; ++d)
    if (out.dim(static_cast<int>(d)) != 1) return;  // slices would be strided
  const int64_t unit = static_cast<int64_t>(dtype_storage_bytes(out.dtype(), 1));
  std::vector<Shape> shapes;
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (const Tensor* t : ins) {
    // Whole-byte elements only (packed 4-bit values have no byte offset per element), every
    // slice non-empty and on a cache line.
    if (!t || !t->is_host() || t->dtype() != out.dtype() || t->numel() == 0 ||
        static_cast<int64_t>(t->nbytes()) != t->numel() * unit || at % kSliceAlign != 0)
      return;
    shapes.push_back(t->shape());
    offsets.push_back(at);
    at += static_cast<int64_t>(t->nbytes());
  }
  if (at != static_cast<int64_t>(out.nbytes())) return;
  cc.dtype = out.dtype();
  cc.out_shape = out.shape();
  cc.in_shapes = std::move(shapes);
  cc.offsets = std::move(offsets);
  cc.armed = true;
}

}  // namespace mpq::rt
