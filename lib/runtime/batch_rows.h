#pragma once
// Whole-graph batch splitting: running a batch as a few smaller batches, one per thread, each on a
// single-thread executor, and joining the outputs, gives the same rows as running it whole when
// every node computes each row of its outputs (index along axis 0) from the same row of its inputs
// alone. `rows_independent` proves that for a graph, op by op, from a list of ops and the
// conditions under which each keeps rows apart; anything else (Shape, Reshape, a Gemm reading the
// batch as B, a Concat along axis 0, subgraphs) keeps the batch whole.
//
// Why: splitting each convolution's batch over the threads (runtime/cpu/conv_onednn.cpp) still
// meets at a barrier after every node, and the nodes between convolutions (pooling, Gemm, layout
// reorders) read rows the other core produced. Two one-thread runs of half the batch side by side
// took 0.58-0.60 ms on resnet_bn where the two-thread run of the whole batch of 8 took 0.60-0.63.
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"

namespace mpq::rt {

// True when every node of the top-level graph keeps rows apart (see above) and every graph output
// holds rows (is computed from a graph input); otherwise false, with `why` naming the first node or
// output that does not.
bool rows_independent(const ir::Model& model, std::string* why = nullptr);

// False when MPQ_BATCH_SPLIT=0 is set: every batch then runs whole, here and in the convolutions'
// own split (for comparisons).
bool batch_split_enabled();

// How many rows each of `threads` parts takes of a batch of `rows`: empty where the batch is not
// worth splitting (fewer rows than threads, or an uneven split with few rows per thread: the
// larger parts would leave a thread waiting). The per-convolution split cuts images by it too.
std::vector<int64_t> row_parts(int64_t rows, int threads);

// Runs split by rows so far in this process (tests); the executor notes each.
int64_t row_split_count();
void note_row_split();

// Rows [begin, begin + count) of t (axis 0), copied.
Tensor slice_rows(const Tensor& t, int64_t begin, int64_t count);
// The parts joined along axis 0 (same dtype and trailing dimensions; BadInput naming `what` if not).
Tensor concat_rows(const std::vector<Tensor>& parts, const std::string& what);

}  // namespace mpq::rt
