#pragma once
// LayerNormalization's float rows (norm.cpp) for kernels that normalise rows of their own.
#include <cstdint>

namespace mpq::rt::cpu {

// Rows [0, rows) of x [rows, d] normalised over their d values, then y = x_hat * scale + bias: the
// LayerNormalization kernel's arithmetic and ISA choice for float32 rows (the same bits), on the
// calling thread. y may be x.
void layernorm_rows_float(const float* x, float* y, const float* scale, const float* bias, int64_t d, double epsilon,
                          int64_t rows);

}  // namespace mpq::rt::cpu
