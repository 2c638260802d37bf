#pragma once
// Values computed from shapes, kept between runs. Exported transformers compute their reshape
// targets at run time: Shape of an activation, then Gather, Unsqueeze, Concat and Slice on those
// few integers (the batch size, the token count, the head split). For a given input shape these
// are the same on every run, yet each is a kernel call with an allocation: the ViT shipped here
// runs about 50 such nodes per image.
//
// A step qualifies when it is a Shape or Size, or a pure op of the list in the .cpp whose every
// input is the output of a qualifying step or a small constant. Such a step's outputs depend only
// on what it reads, and what it reads is small. The first run computes them; the cache keeps a
// private copy of the outputs and a record of the inputs (for Shape and Size, the input's shape;
// otherwise a copy of each input and, for an input another kept step computes, that step's
// version). A later run reuses the outputs when the inputs are the same, and a step recomputes
// where they are not: a new shape is seen at the Shape that reads it, and the change goes only as
// far as the values really change (a kept step whose recomputed outputs equal its kept ones keeps
// its version). A step whose inputs or outputs turn out larger than kMaxValues values is no
// longer kept.
//
// The kept copies are the cache's own and never written: KernelContext::input_reusable wants a
// use_count of 1, which the cache's reference rules out, and the executor gives the caller a copy
// of any output or extra value that shares a kept buffer (shares_buffer), so that what a caller
// writes into its results never reaches a later run.
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
  // (slot and value) and the graph's output slots (a step writing one is never kept).
  void plan(const std::vector<const ir::Node*>& nodes, const std::vector<std::vector<int>>& inputs,
            const std::vector<std::vector<int>>& outputs, size_t slots,
            const std::vector<std::pair<int, Tensor>>& constants, const std::vector<int>& graph_outputs);
  // No step of the plan computes from shapes only (or it was never planned): nothing to do.
  bool empty() const { return !any_planned_; }
  // Whether the plan found step `step` computing from shapes only (fixed once planned).
  bool planned_step(int step) const {
    return step < static_cast<int>(steps_.size()) && steps_[static_cast<size_t>(step)].planned;
  }
  // Whether step `step` is kept now: planned, and its values have stayed small.
  bool kept_step(int step) const {
    return step < static_cast<int>(steps_.size()) && steps_[static_cast<size_t>(step)].eligible;
  }
  // Before a kept step: true, with `outs` its kept outputs, when its inputs equal those of the run
  // that computed them.
  bool reuse(int step, const std::vector<const Tensor*>& ins, std::vector<Tensor>& outs);
  // After a kept step ran: keeps a copy of its outputs and a record of what they came from.
  void remember(int step, const std::vector<const Tensor*>& ins, const std::vector<Tensor>& outs);
  // Whether `t` shares its buffer with a kept output (the executor copies such a result).
  bool shares_buffer(const Tensor& t) const;

  // Steps whose kept outputs were reused so far in this process (tests).
  static int64_t reused_count();

 private:
  struct Step {
    bool planned = false;     // qualifies by the plan
    bool eligible = false;    // still kept (false once its values turned out large)
    bool shape_only = false;  // Shape or Size: the record is the input's shape
    bool valid = false;       // outputs kept from an earlier run
    uint64_t version = 0;     // changes whenever the kept outputs change value
    Shape input_shape;        // shape_only: the input's shape then
    // Otherwise, per input: the planned step that computes it (-1 for a constant or absent one),
    // that step's version then, and a copy of the input then (undefined for an absent one).
    std::vector<int> producer;
    std::vector<uint64_t> key_version;
    std::vector<Tensor> key;
    std::vector<Tensor> outputs;  // the cache's own copies
  };
  void drop(Step& st);
  std::vector<Step> steps_;
  bool any_planned_ = false;
  uint64_t next_version_ = 0;
};

}  // namespace mpq::rt
