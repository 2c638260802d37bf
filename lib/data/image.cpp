#include "data/image.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <fstream>

#include "core/error.h"

// stb is third-party single-header code: keep our warning flags off it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-but-set-variable"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#define STB_IMAGE_IMPLEMENTATION
#define STBI_FAILURE_USERMSG
#include <stb_image.h>
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb_image_resize.h>
#pragma GCC diagnostic pop

namespace mpq::data {

ImageSpec ImageSpec::from_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail_input("{}: cannot open", path.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail_input("{}: not valid JSON: {}", path.string(), e.what());
  }
  ImageSpec s;
  try {
    if (j.contains("size")) {
      auto size = j["size"].get<std::vector<int64_t>>();
      if (size.size() != 2) fail_input("{}: size must be [height, width]", path.string());
      s.height = size[0];
      s.width = size[1];
    }
    if (j.contains("mean")) s.mean = j["mean"].get<std::vector<float>>();
    if (j.contains("std")) s.std = j["std"].get<std::vector<float>>();
    if (j.contains("scale")) s.scale = j["scale"].get<float>();
    if (j.contains("layout")) s.layout = j["layout"].get<std::string>();
    if (j.contains("channel_order")) s.channel_order = j["channel_order"].get<std::string>();
    if (j.contains("channels")) s.channels = j["channels"].get<int>();
  } catch (const nlohmann::json::exception& e) {
    fail_input("{}: {}", path.string(), e.what());
  }
  if (s.layout != "NCHW" && s.layout != "NHWC") fail_input("{}: layout must be NCHW or NHWC", path.string());
  if (s.channel_order != "RGB" && s.channel_order != "BGR") fail_input("{}: channel_order must be RGB or BGR", path.string());
  for (float v : s.std)
    if (v == 0.0f) fail_input("{}: std must not be zero", path.string());
  return s;
}

void ImageSpec::complete_from_shape(const std::vector<int64_t>& dims) {
  if (dims.size() != 4) return;
  bool nhwc = layout == "NHWC";
  int64_t c = nhwc ? dims[3] : dims[1];
  int64_t h = nhwc ? dims[1] : dims[2];
  int64_t w = nhwc ? dims[2] : dims[3];
  if (channels == 0 && c > 0) channels = static_cast<int>(c);
  if (height == 0 && h > 0) height = h;
  if (width == 0 && w > 0) width = w;
}

bool is_image_file(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".bmp" || ext == ".pgm" || ext == ".ppm";
}

Tensor load_image(const std::filesystem::path& path, const ImageSpec& spec) {
  if (spec.height <= 0 || spec.width <= 0)
    fail_input("{}: image size unknown: give it in preprocess.json (\"size\") or with the image flags", path.string());
  const int channels = spec.channels == 0 ? 3 : spec.channels;
  if (channels != 1 && channels != 3) fail_input("{}: images need 1 or 3 channels, model wants {}", path.string(), channels);
  int w = 0, h = 0, n = 0;
  unsigned char* pixels = stbi_load(path.c_str(), &w, &h, &n, channels);
  if (!pixels) fail_input("{}: cannot decode image: {}", path.string(), stbi_failure_reason());
  std::vector<unsigned char> resized(static_cast<size_t>(spec.height * spec.width * channels));
  int ok = stbir_resize_uint8(pixels, w, h, 0, resized.data(), static_cast<int>(spec.width), static_cast<int>(spec.height), 0,
                              channels);
  stbi_image_free(pixels);
  if (!ok) fail_input("{}: resize failed", path.string());
  const bool nhwc = spec.layout == "NHWC";
  Shape shape = nhwc ? Shape{1, spec.height, spec.width, channels} : Shape{1, channels, spec.height, spec.width};
  Tensor t(DType::Float32, shape);
  float* dst = t.data<float>();
  const int64_t hw = spec.height * spec.width;
  for (int64_t p = 0; p < hw; ++p) {
    for (int c = 0; c < channels; ++c) {
      int src_c = (spec.channel_order == "BGR" && channels == 3) ? 2 - c : c;
      float v = static_cast<float>(resized[static_cast<size_t>(p * channels + src_c)]) / spec.scale;
      float mean = spec.mean.size() == 1 ? spec.mean[0] : spec.mean.at(static_cast<size_t>(c));
      float sd = spec.std.size() == 1 ? spec.std[0] : spec.std.at(static_cast<size_t>(c));
      v = (v - mean) / sd;
      if (nhwc) dst[p * channels + c] = v;
      else dst[c * hw + p] = v;
    }
  }
  return t;
}

}  // namespace mpq::data
