#pragma once
// Values computed from shapes, kept between runs. Exported transformers compute their reshape
// targets at run time: Shape of an activation, then Gather, Unsqueeze, Concat and Slice on those
// few integers (the batch size, the token count, the head split). For a given input shape these
// are the same on every run, yet each is a kernel call with an allocation: the ViT shipped here
// runs 60 such nodes per image, 10-14% of its time at batch 1.
//
// A step qualifies when it is a Shape or Size, or a pure op of the list in the .cpp whose every
// input is the output of a qualifying step or a small constant. Such a step's outputs depend only
// on what it reads, and what it reads is small: its outputs are kept with a copy of its inputs (for
// Shape and Size, its input's shape only), and the next run reuses them when the inputs are equal.
// A step whose outputs turn out large (over kMaxValues values) is never kept. Nothing depends on
// the previous run being the same shape: a change is seen at the Shape that reads it, and every
// step after it recomputes only where its inputs differ.
//
// The kept outputs share their buffers with the executor's slots, so no later node takes one over
// in place (KernelContext::input_reusable wants a use_count of 1).
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"

namespace mpq::rt {

// False when MPQ_SHAPE_VALUE_CACHE=0 is set (for comparisons).
bool shape_value_cache_enabled();

class ShapeValueCache {
 public:
  // Values a kept step may read or write, at most.
  static constexpr int64_t kMaxValues = 64;

  // One top-level plan: per step its node and its input and output slots; the plan's constants
  // (slot and value) and the graph's output slots (never kept: the caller may write into them).
  void plan(const std::vector<const ir::Node*>& nodes, const std::vector<std::vector<int>>& inputs,
            const std::vector<std::vector<int>>& outputs, size_t slots,
            const std::vector<std::pair<int, Tensor>>& constants, const std::vector<int>& graph_outputs);
  // Whether step `step` computes from shapes only (its outputs may be kept).
  bool kept_step(int step) const {
    return step < static_cast<int>(steps_.size()) && steps_[static_cast<size_t>(step)].eligible;
  }
  // Before a kept step: true, with `outs` its kept outputs, when its inputs equal those of the run
  // that computed them.
  bool reuse(int step, const std::vector<const Tensor*>& ins, std::vector<Tensor>& outs);
  // After a kept step ran: keeps its outputs and a copy of what they were computed from.
  void remember(int step, const std::vector<const Tensor*>& ins, const std::vector<Tensor>& outs);

  // Steps whose kept outputs were reused so far in this process (tests).
  static int64_t reused_count();

 private:
  struct Step {
    bool eligible = false;
    bool shape_only = false;  // Shape or Size: the key is the input's shape
    bool valid = false;       // outputs kept from an earlier run
    Shape input_shape;        // shape_only: the input's shape then
    // Otherwise, per input: whether an eligible step computes it, and what it was then (undefined
    // for an absent input). A kept step's output is held as it is: that buffer is never written
    // again (see above), so finding it again means the same value. A constant is copied: training
    // may update initializers in place.
    std::vector<char> from_kept_step;
    std::vector<Tensor> key;
    std::vector<Tensor> outputs;
  };
  std::vector<Step> steps_;
};

}  // namespace mpq::rt
