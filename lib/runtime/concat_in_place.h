#pragma once
// Concat written in place by its producers. A Concat whose output is one run of its inputs, one
// after the other (every axis before the concatenation axis of size 1: a batch of one along
// channels, as U-Net's skip connections), needs no copy if each producer writes its output straight
// into its slice of the Concat's output. The executor asks for that through
// KernelContext::set_preferred_outputs: a kernel's alloc_output of the slice's dtype and shape gets
// a view of the slice instead of a new buffer.
//
// Shapes are only known at run time, so each Concat is armed by the shapes of its previous run:
// the first producer of a run allocates the output buffer, and the Concat joins without copying
// when every input is its view at its place (same dtype, shape and address). Anything else runs
// the Concat kernel, which copies, so the result never depends on whether the slices were used. A
// new shape re-arms the Concat for the next run; a producer that handed over another tensor with
// the armed shapes (Identity, Reshape, a Concat feeding this one) disarms it for good, since the
// buffer made for the slices would be allocated and thrown away on every run.
//
// Why: U-Net at batch 1 on two threads spent 13.6 us of its 313 in its two Concats, mostly
// reading what the other core had written (9.5 us on two threads against 5.5 us on one for the
// 128 KiB one).
//
// The views share the buffer's owner, so KernelContext::input_reusable (use_count 1) never lets
// another node write over a slice in place while the Concat still needs it.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"

namespace mpq::rt {

// False when MPQ_CONCAT_IN_PLACE=0 is set (for comparisons).
bool concat_in_place_enabled();

class InPlaceConcats {
 public:
  // One top-level plan: per step its node and its input and output slots; the graph's output
  // slots (never slices: the caller gets them whole). A Concat qualifies when its inputs are
  // distinct values, each computed by an earlier step, read by no other Concat and no graph output.
  void plan(const std::vector<const ir::Node*>& nodes, const std::vector<std::vector<int>>& inputs,
            const std::vector<std::vector<int>>& outputs, size_t slots, const std::vector<int>& graph_outputs);
  bool empty() const { return concats_.empty(); }

  // At the start of a run: no buffer from a run that failed half-way is used again.
  void begin_run();
  // Before step `step`: preferred[i] is the view of the slice output i fills, undefined where none.
  // Returns whether any is defined.
  bool prefer_outputs(int step, const std::vector<int>& out_slots, std::vector<Tensor>& preferred);
  // A Concat step (-1 otherwise).
  int concat_at(int step) const { return step < static_cast<int>(concat_of_step_.size()) ? concat_of_step_[step] : -1; }
  // At Concat `c`: true, with `out` the whole buffer, when every input already sits in its slice.
  bool try_join(int c, const std::vector<const Tensor*>& ins, Tensor& out);
  // After Concat `c` ran or joined: arms it with this run's shapes (or disarms it).
  void remember(int c, const std::vector<const Tensor*>& ins, const Tensor& out);

  // Concats joined without a copy so far in this process (tests).
  static int64_t joined_count();

 private:
  struct Concat {
    int64_t axis = 1;  // the node's attribute, as the kernel reads it (negative: from the end)
    bool armed = false;
    bool never = false;  // a join failed with the armed shapes: this Concat always copies
    DType dtype = DType::Undefined;
    Shape out_shape;
    std::vector<Shape> in_shapes;
    std::vector<int64_t> offsets;  // bytes
    Tensor buffer;                 // this run's output, made at its first producer
  };
  std::vector<Concat> concats_;
  std::vector<int> concat_of_step_;
  std::vector<char> produces_slice_;  // per step: one of its outputs is some Concat's input
  std::vector<std::pair<int, int>> slice_of_slot_;  // (concat, input) per slot, (-1, -1) for none
};

}  // namespace mpq::rt
