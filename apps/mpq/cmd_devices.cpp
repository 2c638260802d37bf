#include <fmt/format.h>

#include <cstdlib>
#include <iostream>

#include "cli.h"
#include "runtime/cuda/context.h"
#include "runtime/blas_kernels.h"
#include "runtime/devices.h"

namespace mpq::cli {

void setup_devices(CLI::App& sub, Action& action) {
  auto json = std::make_shared<bool>(false);
  sub.add_flag("--json", *json, "print one JSON object to stdout");
  sub.footer("Example: mpq devices --json");
  action = nullptr;
  sub.callback([&action, json] {
    action = [json] {
      rt::DeviceReport d = rt::query_devices();
      const rt::BlasKernels& blas = rt::ensure_blas_kernels();
      if (*json) {
        nlohmann::json j;
        j["cpu"] = true;
        j["blas_kernels"] = {{"detected", blas.detected},
                             {"active", blas.active},
                             {"reason", blas.reason},
                             {"below_cpu", rt::blas_kernels_below_cpu()}};
        j["cuda_built"] = d.cuda_built;
        j["cuda_runtime_version"] = d.cuda_runtime_version;
        j["cuda_driver_version"] = d.cuda_driver_version;
        j["cublaslt_version"] = d.cublaslt_version;
        j["gpus"] = nlohmann::json::array();
        for (const auto& g : d.gpus)
          j["gpus"].push_back({{"index", g.index}, {"name", g.name}, {"compute_capability", fmt::format("{}.{}", g.compute_major, g.compute_minor)},
                               {"memory_bytes", g.memory_bytes}, {"multiprocessors", g.multiprocessors}});
        if (!d.cuda_unavailable_reason.empty()) j["cuda_unavailable"] = d.cuda_unavailable_reason;
        j["cuda_emulated_on_host"] = rt::gpu::CudaContext::emulating();
        std::cout << j.dump(2) << "\n";
        return 0;
      }
      std::cout << "cpu: available\n";
      if (!blas.active.empty()) {
        if (blas.active != blas.detected)
          std::cout << fmt::format("cpu: OpenBLAS kernels {} (it picked {}: {})\n", blas.active, blas.detected, blas.reason);
        else
          std::cout << fmt::format("cpu: OpenBLAS kernels {} ({})\n", blas.active, blas.reason);
        if (rt::blas_kernels_below_cpu()) {
          const char* forced = std::getenv("OPENBLAS_CORETYPE");
          std::cout << fmt::format(
              "cpu: these kernels have no AVX-512, which this CPU has{}: OpenBLAS's GEMMs run at about half speed, and "
              "mpq sends more products to oneDNN\n",
              forced ? fmt::format(" (OPENBLAS_CORETYPE={}; without it OpenBLAS picks its best)", forced) : "");
        }
      }
      if (!d.cuda_built) {
        std::cout << "cuda: " << d.cuda_unavailable_reason << "\n";
        return 0;
      }
      std::cout << fmt::format("cuda: built with runtime {}, cuBLASLt {}, driver {}\n", d.cuda_runtime_version,
                               d.cublaslt_version, d.cuda_driver_version ? std::to_string(d.cuda_driver_version) : "none");
      if (d.gpus.empty()) std::cout << "cuda: " << d.cuda_unavailable_reason << "\n";
      if (rt::gpu::CudaContext::emulating())
        std::cout << "cuda: MPQ_CUDA_EMULATE=host: --device cuda runs the CUDA path's kernel bodies on the CPU (testing)\n";
      for (const auto& g : d.gpus)
        std::cout << fmt::format("gpu {}: {} (sm_{}{}, {} SMs, {:.1f} GiB)\n", g.index, g.name, g.compute_major,
                                 g.compute_minor, g.multiprocessors, static_cast<double>(g.memory_bytes) / (1 << 30));
      return 0;
    };
  });
}

}  // namespace mpq::cli
