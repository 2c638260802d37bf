#pragma once
// Image files (PNG, JPEG, BMP, ...) decoded with stb_image and preprocessed into a model input.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mpq::data {

struct ImageSpec {
  int64_t height = 0;  // 0: take the model input's size
  int64_t width = 0;
  int channels = 0;    // 1 (grayscale) or 3; 0: take the model input's channel count
  std::vector<float> mean{0.0f};  // per channel (or one value), applied after scaling
  std::vector<float> std{1.0f};
  float scale = 255.0f;           // pixel / scale before mean/std
  std::string layout = "NCHW";    // or "NHWC"
  std::string channel_order = "RGB";  // or "BGR"

  // Reads preprocess.json ({"size": [h, w], "mean": [...], "std": [...], "scale": 255,
  // "layout": "NCHW", "channel_order": "RGB", "channels": 3}).
  static ImageSpec from_json_file(const std::filesystem::path& path);
  // Fills size/channels from a model input shape ([N,C,H,W] or [N,H,W,C]) where left at 0.
  void complete_from_shape(const std::vector<int64_t>& dims);
};

bool is_image_file(const std::filesystem::path& path);

// Decodes, resizes (bilinear) and normalises one image into a [1,C,H,W] or [1,H,W,C] float32 tensor.
Tensor load_image(const std::filesystem::path& path, const ImageSpec& spec);

}  // namespace mpq::data
